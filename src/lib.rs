//! rollgate: safe, gated, event-driven Kubernetes version upgrades and etcd rolls.

pub mod adapters;
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod disk;
pub mod domain;
pub mod http;
pub mod jitter;
pub mod logging;
pub mod metrics;
pub mod ports;
pub mod queue;
pub mod reference;
pub mod setting;
pub mod sqlite;
pub mod store;
pub mod worker;
pub mod workflows;

/// `error` and each of its sources, joined with `: ` — what a run's reason and a log line
/// show, so a cause is never lost behind its wrapper. A source whose text its wrapper
/// already ends with is not repeated.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Level {
        text: &'static str,
        #[source]
        source: Option<Box<Level>>,
    }

    fn chain(texts: &[&'static str]) -> Level {
        texts
            .iter()
            .rev()
            .fold(None, |source, text| {
                Some(Level {
                    text,
                    source: source.map(Box::new),
                })
            })
            .unwrap()
    }

    #[test]
    fn the_chain_shows_every_cause_once() {
        let cases: [(&[&str], &str); 4] = [
            (&["alone"], "alone"),
            (
                &[
                    "patch node w1",
                    "error sending request",
                    "connection refused",
                ],
                "patch node w1: error sending request: connection refused",
            ),
            // A wrapper that already prints its source is not repeated.
            (
                &["run store: disk I/O error", "disk I/O error"],
                "run store: disk I/O error",
            ),
            (&["a", "a: b", "b"], "a: a: b"),
        ];
        for (texts, want) in cases {
            assert_eq!(error_chain(&chain(texts)), want, "{texts:?}");
        }
    }
}
