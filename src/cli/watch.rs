//! `rollgate runs watch ID`: follows one run through the event stream (`GET /v1/events`)
//! until it ends, a line per transition with the run's progress, the current stage's
//! nodes and what holds it; reconnects (with `Last-Event-ID`) when rollgate restarts.
//! The exit status says how the run ended; with `--until-held` it stops when the run is
//! held.

use anyhow::{Context as _, bail};
use serde_json::Value;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long `watch` keeps trying to reach rollgate again before it gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(120);

/// One Server-Sent Events frame.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// `id:`, if any.
    pub id: Option<String>,
    /// `event:`, `message` when none.
    pub event: String,
    /// `data:` lines joined by newlines.
    pub data: String,
}

/// Reads SSE frames out of a byte stream, chunk by chunk.
#[derive(Default)]
pub struct FrameReader {
    pending: String,
}

impl FrameReader {
    /// Adds `chunk`; returns the frames it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Frame> {
        self.pending
            .push_str(&String::from_utf8_lossy(chunk).replace("\r\n", "\n"));
        let mut frames = Vec::new();
        while let Some(end) = self.pending.find("\n\n") {
            let raw: String = self.pending.drain(..end + 2).collect();
            let mut frame = Frame::default();
            let mut data = Vec::new();
            for line in raw.lines() {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "id" => frame.id = Some(value.to_owned()),
                    "event" => frame.event = value.to_owned(),
                    "data" => data.push(value.to_owned()),
                    _ => {}
                }
            }
            if data.is_empty() {
                continue;
            }
            if frame.event.is_empty() {
                frame.event = "message".into();
            }
            frame.data = data.join("\n");
            frames.push(frame);
        }
        frames
    }
}

/// How a run's end maps to the exit status: 0 succeeded, 3 halted, 4 failed, 5 aborted.
pub fn exit_code(status: &str) -> Option<u8> {
    match status {
        "succeeded" => Some(0),
        "halted" => Some(3),
        "failed" => Some(4),
        "aborted" => Some(5),
        _ => None,
    }
}

/// What ends a watch besides the run's own end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Only the run's end.
    Ended,
    /// Also the run being held (exit 0); its end first is exit [`NEVER_HELD`].
    Held,
}

/// The exit status of `watch --until-held` when the run ended without being held.
pub const NEVER_HELD: u8 = 6;

/// Whether `run` is held now: waiting, with what holds it named (a closed gate's alerts,
/// an unknown gate's reason).
pub fn held_now(run: &Value) -> bool {
    run["status"] == "waiting" && run["blockers"].as_array().is_some_and(|b| !b.is_empty())
}

/// Prints each gate verdict once while it repeats: a held run's gate is asked every poll.
#[derive(Default)]
pub struct Repeats {
    last: Option<String>,
}

impl Repeats {
    /// `line` the first time, and again only after another line came between.
    pub fn fresh(&mut self, line: String) -> Option<String> {
        if self.last.as_deref() == Some(line.as_str()) {
            return None;
        }
        self.last = Some(line.clone());
        Some(line)
    }

    /// A transition came between: the next verdict prints again.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

fn bar(done: usize, total: usize, width: usize) -> String {
    let filled = (done * width).checked_div(total).unwrap_or(width);
    format!("{}{}", "#".repeat(filled), ".".repeat(width - filled))
}

/// The run's progress in one line: steps done of all, a bar, and the nodes of the stage in
/// hand (`+` done, `>` in hand, `.` to come).
pub fn progress(run: &Value) -> String {
    let steps = run["steps"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let done = steps.iter().filter(|s| s["status"] == "done").count();
    let current = run["current_step"]
        .as_u64()
        .and_then(|i| steps.get(i as usize));
    let stage = current.and_then(|s| s["stage"].as_str()).unwrap_or("-");
    let mut nodes: Vec<(String, char)> = Vec::new();
    for step in steps.iter().filter(|s| s["stage"] == stage) {
        let Some(node) = step["node"].as_str() else {
            continue;
        };
        let mark = match step["status"].as_str() {
            Some("pending") => '.',
            Some("done") => '+',
            _ => '>',
        };
        match nodes.iter_mut().find(|(n, _)| n == node) {
            // A node is done when all its steps are; in hand when one has begun.
            Some((_, m)) => {
                *m = match (*m, mark) {
                    ('+', '+') => '+',
                    ('.', '.') => '.',
                    _ => '>',
                }
            }
            None => nodes.push((node.to_owned(), mark)),
        }
    }
    let nodes: Vec<String> = nodes.iter().map(|(n, m)| format!("{m}{n}")).collect();
    let mut line = format!(
        "[{}] {done}/{} steps  stage {stage}",
        bar(done, steps.len(), 20),
        steps.len()
    );
    if !nodes.is_empty() {
        line.push_str(": ");
        line.push_str(&nodes.join(" "));
    }
    line
}

/// One transition as a line.
fn transition_line(event: &Value) -> String {
    let at = event["at"].as_str().unwrap_or_default();
    let time = at.get(11..19).unwrap_or(at);
    let mut line = format!(
        "{time}  {:<9} {:<28} {}",
        event["to"].as_str().unwrap_or("-"),
        event["step"].as_str().unwrap_or("-"),
        event["reason"].as_str().unwrap_or_default()
    );
    if let Some(blockers) = event["blockers"].as_array().filter(|b| !b.is_empty()) {
        let names: Vec<&str> = blockers.iter().filter_map(Value::as_str).collect();
        line.push_str(&format!("\n          held by: {}", names.join("; ")));
    }
    line
}

/// Follows run `id` at `base` until it ends; its exit status.
pub(super) async fn watch(
    client: &reqwest::Client,
    base: &reqwest::Url,
    token: &str,
    id: &str,
    until: Until,
) -> anyhow::Result<ExitCode> {
    let run_url = super::api_url(base, &["v1", "runs", id])?;
    let fetch = || async {
        let resp = client
            .get(run_url.clone())
            .bearer_auth(token)
            .send()
            .await
            .with_context(|| format!("cannot reach rollgate at {base}"))?;
        let status = resp.status();
        let run: Value = resp.json().await.context("the answer is not JSON")?;
        if !status.is_success() {
            bail!(
                "{status}: {}",
                run["message"].as_str().unwrap_or("no message")
            );
        }
        anyhow::Ok(run)
    };
    let run = fetch().await?;
    println!(
        "run {id}: {} {}",
        run["kind"].as_str().unwrap_or("-"),
        run["target"].as_str().unwrap_or("")
    );
    let held = |run: &Value| {
        let names: Vec<&str> = run["blockers"]
            .as_array()
            .map(|b| b.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        println!(
            "held: {}\n          by: {}",
            run["reason"].as_str().unwrap_or_default(),
            names.join("; ")
        );
        Ok(ExitCode::SUCCESS)
    };
    if until == Until::Held && held_now(&run) {
        return held(&run);
    }
    let mut gates = Repeats::default();
    let mut last_id = String::from("0");
    let mut reader = FrameReader::default();
    let mut lost_since: Option<Instant> = None;
    loop {
        let mut url = super::api_url(base, &["v1", "events"])?;
        url.query_pairs_mut().append_pair("run", id);
        let connected = client
            .get(url)
            .bearer_auth(token)
            .header("Last-Event-ID", &last_id)
            .timeout(Duration::from_secs(24 * 3600))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success());
        let Some(mut resp) = connected else {
            let since = *lost_since.get_or_insert_with(Instant::now);
            if since.elapsed() > RECONNECT_FOR {
                bail!("lost rollgate at {base} for {}s", RECONNECT_FOR.as_secs());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        lost_since = None;
        while let Ok(Some(chunk)) = resp.chunk().await {
            for frame in reader.push(&chunk) {
                match frame.event.as_str() {
                    "transition" => {
                        if let Some(seq) = frame.id {
                            last_id = seq;
                        }
                        let event: Value = serde_json::from_str(&frame.data).unwrap_or_default();
                        println!("{}", transition_line(&event));
                        let to = event["to"].as_str().unwrap_or_default();
                        // The run as it is now: gone for a moment while rollgate restarts.
                        let run = fetch().await.ok();
                        if let Some(run) = &run {
                            println!("          {}", progress(run));
                        }
                        gates.reset();
                        if until == Until::Held
                            && let Some(run) = run.as_ref().filter(|r| held_now(r))
                        {
                            return held(run);
                        }
                        // Halted may be resumed: it ends the watch only when it is where
                        // the run stands now (the log is replayed from its start).
                        let ended = match (to, &run) {
                            ("halted", Some(run)) if run["status"] != "halted" => None,
                            ("halted", None) => None,
                            _ => exit_code(to),
                        };
                        if let Some(code) = ended {
                            return Ok(ExitCode::from(match until {
                                Until::Held => NEVER_HELD,
                                Until::Ended => code,
                            }));
                        }
                    }
                    "gate" => {
                        let report: Value = serde_json::from_str(&frame.data).unwrap_or_default();
                        let line = format!(
                            "          gate {}",
                            report["verdict"]["verdict"].as_str().unwrap_or("-")
                        );
                        if let Some(line) = gates.fresh(line) {
                            println!("{line}");
                        }
                    }
                    _ => {}
                }
            }
        }
        // The stream ended (rollgate restarting): reconnect from the last transition seen.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frames_are_read_across_chunks() {
        let mut reader = FrameReader::default();
        assert!(reader.push(b"retry: 1000\n\n").is_empty());
        assert!(
            reader
                .push(b": keep-alive\n\nid: 7\nevent: tran")
                .is_empty()
        );
        let frames =
            reader.push(b"sition\ndata: {\"a\":1}\n\nevent: gate\r\ndata: x\r\ndata: y\r\n\r\n");
        assert_eq!(
            frames,
            [
                Frame {
                    id: Some("7".into()),
                    event: "transition".into(),
                    data: "{\"a\":1}".into()
                },
                Frame {
                    id: None,
                    event: "gate".into(),
                    data: "x\ny".into()
                }
            ]
        );
    }

    #[test]
    fn progress_shows_the_stage_in_hand_and_its_nodes() {
        let step = |stage: &str, name: &str, node: Option<&str>, status: &str| json!({"stage": stage, "name": name, "node": node, "status": status});
        let run = json!({
            "current_step": 4,
            "steps": [
                step("plan", "plan", None, "done"),
                step("workers", "drain", Some("w1"), "done"),
                step("workers", "uncordon", Some("w1"), "done"),
                step("workers", "drain", Some("w2"), "done"),
                step("workers", "upgrade", Some("w2"), "running"),
                step("workers", "drain", Some("w3"), "pending"),
                step("finish", "clear-in-flight", None, "pending"),
            ]
        });
        assert_eq!(
            progress(&run),
            "[###########.........] 4/7 steps  stage workers: +w1 >w2 .w3"
        );
        assert_eq!(bar(0, 0, 4), "####");
    }

    #[test]
    fn a_run_is_held_when_it_waits_naming_what_holds_it() {
        let cases = [
            (
                json!({"status": "waiting", "blockers": ["EtcdNoLeader"]}),
                true,
            ),
            (json!({"status": "waiting", "blockers": []}), false),
            (json!({"status": "waiting"}), false),
            (json!({"status": "running", "blockers": ["x"]}), false),
            (json!({"status": "halted", "blockers": ["x"]}), false),
        ];
        for (run, held) in cases {
            assert_eq!(held_now(&run), held, "{run}");
        }
    }

    #[test]
    fn a_repeated_verdict_prints_once_until_something_comes_between() {
        let mut r = Repeats::default();
        let mut printed = Vec::new();
        for (line, transition_before) in [
            ("closed", false),
            ("closed", false),
            ("closed", false),
            ("open", false),
            ("open", true),
            ("open", false),
        ] {
            if transition_before {
                r.reset();
            }
            printed.extend(r.fresh(line.to_owned()));
        }
        assert_eq!(printed, ["closed", "open", "open"]);
    }

    #[test]
    fn each_end_has_its_exit_status() {
        let cases = [
            ("succeeded", Some(0)),
            ("halted", Some(3)),
            ("failed", Some(4)),
            ("aborted", Some(5)),
            ("waiting", None),
            ("running", None),
        ];
        for (status, code) in cases {
            assert_eq!(exit_code(status), code, "{status}");
        }
    }
}
