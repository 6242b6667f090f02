//! Automatic etcd rolls: which StatefulSets `serve` watches (`etcd_roll.watch`), when a
//! watched one needs a roll, and the one run each revision gets.

use std::fmt;

/// A watched StatefulSet: `namespace/name`, optionally `=URL` where its members answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchTarget {
    /// The StatefulSet's namespace.
    pub namespace: String,
    /// The StatefulSet whose pods are the members.
    pub name: String,
    /// A client URL that reaches the members (a client Service, say); `None`: the
    /// StatefulSet's governing Service, `<serviceName>.<namespace>.svc:2379`.
    pub seed: Option<String>,
}

impl fmt::Display for WatchTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Whether `s` is a Kubernetes object name (DNS-1123 label: lower-case letters, digits
/// and '-', starting and ending alphanumeric, at most 63).
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl WatchTarget {
    /// Parses `namespace/name` or `namespace/name=http(s)://host:port`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (object, seed) = match raw.split_once('=') {
            Some((o, s)) => (o.trim(), Some(s.trim())),
            None => (raw.trim(), None),
        };
        let Some((namespace, name)) = object.split_once('/') else {
            return Err(format!(
                "{raw:?} is not namespace/statefulset (optionally =http(s)://host:port)"
            ));
        };
        for (what, part) in [("namespace", namespace), ("statefulset name", name)] {
            if !dns_label(part) {
                return Err(format!("{raw:?}: {part:?} is not a valid {what}"));
            }
        }
        if let Some(seed) = seed {
            let rest = seed
                .strip_prefix("http://")
                .or_else(|| seed.strip_prefix("https://"));
            let valid = rest.is_some_and(|hp| {
                hp.rsplit_once(':').is_some_and(|(host, port)| {
                    !host.is_empty()
                        && !host.contains(['/', ' ', '@'])
                        && port.parse::<u16>().is_ok_and(|p| p > 0)
                })
            });
            if !valid {
                return Err(format!(
                    "{raw:?}: {seed:?} is not a client URL like https://etcd-client.etcd.svc:2379"
                ));
            }
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            seed: seed.map(str::to_owned),
        })
    }

    /// Where to reach the members: the seed, or the StatefulSet's governing Service
    /// `service` on etcd's client port.
    pub fn seed_url(&self, service: &str, tls: bool) -> String {
        match &self.seed {
            Some(seed) => seed.clone(),
            None => format!(
                "{}://{service}.{}.svc:2379",
                if tls { "https" } else { "http" },
                self.namespace
            ),
        }
    }

    /// The id of the run that rolls this StatefulSet to `revision`: one run per revision,
    /// whatever happens to it, also across restarts.
    pub fn run_id(&self, revision: &str) -> String {
        format!("watch-{}-{}-{revision}", self.namespace, self.name)
    }
}

/// What a watched StatefulSet's new revision led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchedRoll {
    /// A roll to this revision was queued: the run's id.
    Started(String),
    /// This revision already has its run (whatever became of it): no second one.
    AlreadyRolled(String),
    /// Another roll of this StatefulSet is in flight (its id): this one waits for it.
    Waiting(String),
}

/// The revision a StatefulSet should be rolled to: its update revision, when it differs
/// from the current one (the template moved on; the partition holds the pods).
pub fn revision_to_roll<'a>(current: &str, update: &'a str) -> Option<&'a str> {
    (!update.is_empty() && update != current).then_some(update)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        type Want = Option<(&'static str, &'static str, Option<&'static str>)>;
        let cases: [(&str, Want); 10] = [
            ("etcd/etcd", Some(("etcd", "etcd", None))),
            (" etcd/main-etcd ", Some(("etcd", "main-etcd", None))),
            (
                "etcd/etcd=https://etcd-client.etcd.svc:2379",
                Some(("etcd", "etcd", Some("https://etcd-client.etcd.svc:2379"))),
            ),
            (
                "default/etcd=http://127.0.0.1:2379",
                Some(("default", "etcd", Some("http://127.0.0.1:2379"))),
            ),
            ("etcd", None),
            ("etcd/", None),
            ("Etcd/etcd", None),
            ("etcd/etcd;rm -rf /", None),
            ("etcd/etcd=ftp://x:1", None),
            ("etcd/etcd=https://x", None),
        ];
        for (raw, want) in cases {
            let got = WatchTarget::parse(raw).ok();
            let want = want.map(|(namespace, name, seed)| WatchTarget {
                namespace: namespace.into(),
                name: name.into(),
                seed: seed.map(Into::into),
            });
            assert_eq!(got, want, "{raw}");
        }
    }

    #[test]
    fn the_seed_is_the_governing_service_unless_given() {
        let t = WatchTarget::parse("etcd/main").unwrap();
        assert_eq!(
            t.seed_url("main-peers", true),
            "https://main-peers.etcd.svc:2379"
        );
        assert_eq!(
            t.seed_url("main-peers", false),
            "http://main-peers.etcd.svc:2379"
        );
        let t = WatchTarget::parse("etcd/main=http://10.0.0.1:2379").unwrap();
        assert_eq!(t.seed_url("main-peers", true), "http://10.0.0.1:2379");
    }

    #[test]
    fn a_roll_is_wanted_when_the_template_moved_on() {
        let cases = [
            ("rev-1", "rev-2", Some("rev-2")),
            ("rev-2", "rev-2", None),
            ("", "rev-1", Some("rev-1")),
            ("rev-1", "", None),
        ];
        for (current, update, want) in cases {
            assert_eq!(
                revision_to_roll(current, update),
                want,
                "{current} {update}"
            );
        }
        let t = WatchTarget::parse("etcd/main").unwrap();
        assert_eq!(t.run_id("main-7f9c"), "watch-etcd-main-main-7f9c");
    }
}
