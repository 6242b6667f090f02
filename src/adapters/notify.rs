//! Notification sinks: a log sink, and a Slack incoming webhook (URL read from a file)
//! with retries and back-off. Neither ever blocks or fails a run.

use std::sync::Arc;
use std::time::Duration;

use crate::config::NotifySettings;
use crate::domain::backoff::Backoff;
use crate::metrics::Metrics;
use crate::ports::{Delivery, Notice, Notifier, TransitionSink};

/// The pause between Slack attempts.
const SLACK_RETRY: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));

/// Logs every notice.
pub struct LogNotifier;

impl Notifier for LogNotifier {
    fn notify(&self, n: Notice) {
        tracing::info!(
            run_id = %n.run_id,
            from = n.from.map_or("-", |s| s.name()),
            to = %n.to,
            step = n.step.as_deref().unwrap_or("-"),
            blockers = ?n.blockers,
            reason = %n.reason,
            "run transition"
        );
    }
}

/// Posts every notice to a Slack incoming webhook.
pub struct SlackNotifier {
    url: Arc<str>,
    http: reqwest::Client,
    retries: u32,
    metrics: Metrics,
}

/// Why the Slack sink could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("Slack notifier: {0}")]
pub struct SlackError(String);

impl SlackNotifier {
    /// Reads the webhook URL from `notify.slack_webhook_file`.
    pub fn new(settings: &NotifySettings, metrics: Metrics) -> Result<Option<Self>, SlackError> {
        let Some(path) = &settings.slack_webhook_file else {
            return Ok(None);
        };
        let url = std::fs::read_to_string(path)
            .map_err(|e| {
                SlackError(format!(
                    "cannot read notify.slack_webhook_file {}: {e}",
                    path.display()
                ))
            })?
            .trim()
            .to_owned();
        if reqwest::Url::parse(&url).is_err() {
            // Never echo the file's content: it is a secret.
            return Err(SlackError(format!(
                "{} does not hold a URL",
                path.display()
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(settings.timeout)
            .timeout(settings.timeout)
            .build()
            .map_err(|e| SlackError(e.to_string()))?;
        Ok(Some(Self {
            url: url.into(),
            http,
            retries: settings.retries,
            metrics,
        }))
    }
}

/// The Slack message: a text fallback plus blocks naming run, stage, node and blockers.
pub fn slack_message(n: &Notice) -> serde_json::Value {
    let emoji = match n.to {
        crate::domain::run::RunStatus::Halted | crate::domain::run::RunStatus::Failed => {
            ":octagonal_sign:"
        }
        crate::domain::run::RunStatus::Waiting => ":hourglass_flowing_sand:",
        crate::domain::run::RunStatus::Succeeded => ":white_check_mark:",
        _ => ":arrow_forward:",
    };
    let target = n.target.as_deref().unwrap_or("-");
    let from = n.from.map_or("new", |s| s.name());
    let text = format!(
        "{emoji} rollgate {} {target} run {}: {from} → {}: {}",
        n.kind, n.run_id, n.to, n.reason
    );
    let mut fields = vec![
        serde_json::json!({"type": "mrkdwn", "text": format!("*Run*\n`{}`", n.run_id)}),
        serde_json::json!({"type": "mrkdwn", "text": format!("*Status*\n{from} → {}", n.to)}),
        serde_json::json!({"type": "mrkdwn", "text": format!("*Target*\n{} {target}", n.kind)}),
        serde_json::json!({"type": "mrkdwn", "text": format!("*Step*\n{}", n.step.as_deref().unwrap_or("-"))}),
    ];
    if !n.blockers.is_empty() {
        fields.push(serde_json::json!({"type": "mrkdwn", "text": format!("*Blockers*\n{}", n.blockers.join("\n"))}));
    }
    serde_json::json!({
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": format!("{emoji} *{}*", n.reason)}},
            {"type": "section", "fields": fields},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": format!("rollgate · {}", n.at.to_rfc3339())}]}
        ]
    })
}

#[async_trait::async_trait]
impl TransitionSink for SlackNotifier {
    fn name(&self) -> &'static str {
        "slack"
    }

    async fn deliver(&self, notice: &Notice) -> Delivery {
        let body = slack_message(notice);
        let count = |outcome| {
            self.metrics
                .notifications
                .with_label_values(&["slack", outcome])
                .inc()
        };
        for attempt in 0..=self.retries {
            match self.http.post(&*self.url).json(&body).send().await {
                Ok(r) if r.status().is_success() => {
                    count("sent");
                    return Delivery::Sent;
                }
                // Errors name the status, never the URL (it carries the secret).
                Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                    tracing::warn!(status = %r.status(), run_id = %notice.run_id, "Slack refused a notification for good");
                    count("failed");
                    return Delivery::Refused;
                }
                Ok(r) => {
                    tracing::warn!(status = %r.status(), attempt, run_id = %notice.run_id, "Slack refused a notification")
                }
                Err(e) => {
                    tracing::warn!(error = %e.without_url(), attempt, run_id = %notice.run_id, "Slack unreachable")
                }
            }
            if attempt < self.retries {
                count("retried");
                tokio::time::sleep(crate::jitter::pause(&SLACK_RETRY, attempt + 1)).await;
            }
        }
        count("failed");
        Delivery::Later
    }
}

/// Sends every notice to several sinks.
pub struct Fanout(pub Vec<Arc<dyn Notifier>>);

impl Notifier for Fanout {
    fn notify(&self, notice: Notice) {
        for sink in &self.0 {
            sink.notify(notice.clone());
        }
    }
}
