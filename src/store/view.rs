//! A run to show, composed from its stored documents instead of decoded and encoded
//! again: only the head is read into a [`Run`]; the steps are copied as stored, and each
//! transition is taken out of its log event as written. A 1,000-node upgrade holds over
//! 4,000 steps, and the API and the status page ask for it every few hundred milliseconds.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use super::StoreError;
use crate::domain::run::Run;

/// One run as stored: its head decoded, its steps and transitions as the store holds them.
#[derive(Debug)]
pub struct RunView {
    /// The run without its steps and history.
    pub head: Run,
    /// The documents of the steps kept, in order.
    steps: Vec<String>,
    /// The documents of the log events read, in order.
    events: Vec<String>,
    /// The index of the first step kept.
    pub steps_from: usize,
    /// How many steps the run has.
    pub steps_total: usize,
    /// The number of the first transition read.
    pub history_from: usize,
    /// How many transitions the run's log holds.
    pub history_total: usize,
}

/// A transition as a log event holds it, borrowed: the event's other fields are dropped.
#[derive(Deserialize, Serialize)]
struct LoggedTransition<'a> {
    #[serde(borrow)]
    at: &'a RawValue,
    #[serde(borrow)]
    from: &'a RawValue,
    #[serde(borrow)]
    to: &'a RawValue,
    #[serde(borrow)]
    step: &'a RawValue,
    #[serde(borrow)]
    reason: &'a RawValue,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    by: Option<&'a RawValue>,
}

impl RunView {
    pub(super) fn new(
        head: Run,
        steps: Vec<String>,
        events: Vec<String>,
        history_from: usize,
        logged: usize,
    ) -> Self {
        let steps_total = steps.len();
        let history_total = logged.max(history_from + events.len());
        Self {
            head,
            steps,
            events,
            steps_from: 0,
            steps_total,
            history_from,
            history_total,
        }
    }

    /// Keeps the steps from index `from` on, at most `limit` of them.
    pub fn keep_steps(&mut self, from: usize, limit: Option<usize>) {
        let from = from.min(self.steps.len());
        let end = limit.map_or(self.steps.len(), |l| (from + l).min(self.steps.len()));
        self.steps.truncate(end);
        self.steps.drain(..from);
        self.steps_from = from;
    }

    /// The run as JSON, as [`Run`]'s encoding would write it with the steps and
    /// transitions kept, and `extra` fields beside them.
    pub fn to_json(&self, extra: &[(&str, Value)]) -> Result<Vec<u8>, StoreError> {
        let corrupt = |e: serde_json::Error| StoreError::Corrupt {
            id: self.head.id.clone(),
            error: e.to_string(),
        };
        let mut head = match serde_json::to_value(&self.head).map_err(corrupt)? {
            Value::Object(head) => head,
            other => {
                return Err(StoreError::Corrupt {
                    id: self.head.id.clone(),
                    error: format!("a run's head encodes as {other}, not an object"),
                });
            }
        };
        head.remove("steps");
        head.remove("history");
        for (name, value) in extra {
            head.insert((*name).to_owned(), value.clone());
        }
        let size = self
            .steps
            .iter()
            .chain(&self.events)
            .map(String::len)
            .sum::<usize>();
        let mut out = Vec::with_capacity(size + 4096);
        serde_json::to_writer(&mut out, &head).map_err(corrupt)?;
        out.pop();
        if !head.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(b"\"steps\":[");
        for (i, step) in self.steps.iter().enumerate() {
            let step: &RawValue = serde_json::from_str(step).map_err(corrupt)?;
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(step.get().as_bytes());
        }
        out.extend_from_slice(b"],\"history\":[");
        for (i, event) in self.events.iter().enumerate() {
            let transition: LoggedTransition = serde_json::from_str(event).map_err(corrupt)?;
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut out, &transition).map_err(corrupt)?;
        }
        out.extend_from_slice(b"]}");
        Ok(out)
    }
}
