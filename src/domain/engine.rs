//! The run state machine: `(run, input) -> (run', next)`, a pure function.
//!
//! The worker feeds it inputs (a start, a step's outcome, a wake, an operator's control)
//! and carries out what it returns (run a step, schedule a wake). It never does IO.

use chrono::{DateTime, Utc};

use super::analysis::Finding;
use super::backoff::Backoff;
use super::budget::FailureBudget;
use super::event::ControlAction;
use super::run::{Held, Learned, Run, RunStatus, Step, StepStatus};

/// What the engine needs to know about the world besides the run.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    /// The time this input is applied at; every timestamp the engine writes is this one.
    pub now: DateTime<Utc>,
    /// Whether something can execute this step.
    pub can_execute: &'a dyn Fn(&Step) -> bool,
    /// How many times a step may be started before it gives up.
    pub max_attempts: u32,
    /// How long a closed gate may hold a step before the run halts.
    pub halt_after: chrono::Duration,
    /// The pause before a failed step is tried again.
    pub retry: Backoff,
    /// How many workers may be left behind while the run goes on.
    pub failure_budget: FailureBudget,
    /// A uniform sample from `[0, 1)` that jitters this input's retry pause.
    pub jitter: f64,
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// Done; go on.
    Done {
        /// What happened.
        note: String,
        /// What the step learned that later steps need.
        learned: Option<Learned>,
    },
    /// Done, and the steps after it are now known: they replace whatever followed.
    Planned {
        /// What happened.
        note: String,
        /// The steps that follow.
        steps: Vec<Step>,
    },
    /// Done, and the steps of this step's stage that follow are now known: they replace
    /// the ones planned so far; the steps of later stages stay.
    Replanned {
        /// What happened.
        note: String,
        /// The steps that follow in this stage.
        steps: Vec<Step>,
    },
    /// Done, and the rest of this step's worker cycle is not needed (a node that no longer
    /// needs its reboot): those steps are done too, each with `note`, untouched.
    SkipCycle {
        /// Why, in words.
        note: String,
    },
    /// Not done and not failed: come back to this step at `until` (gate closed, soak).
    Wait {
        /// When to run the step again.
        until: DateTime<Utc>,
        /// Why, in words; recorded in the run's history.
        reason: String,
    },
    /// Failed in a way worth retrying, unless attempts are used up; the engine sets when,
    /// by the run's back-off.
    Retry {
        /// What went wrong.
        error: String,
    },
    /// Failed for good.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// Found what must stop the run whatever its failure policy (a batch analysis that
    /// failed): the step is failed, the run halts once the steps in hand have finished, and
    /// a resume starts the step again.
    Halt {
        /// Why, in words; the run's reason.
        reason: String,
    },
    /// Done, and worth telling everyone: `note` also goes into the run's history, so that
    /// Slack, the Events and the log say it (a fleet wave promoting a version).
    Announced {
        /// What happened.
        note: String,
    },
    /// `then`, with what the step found (a batch analysis's verdicts and their figures):
    /// kept on the step, in place of what it found before.
    Judged {
        /// What it found.
        findings: Vec<Finding>,
        /// How it ended.
        then: Box<StepOutcome>,
    },
    /// Waits for an operator's approval (`POST /v1/runs/{id}/approve`); meanwhile come back
    /// to the step at `until`.
    AwaitApproval {
        /// When to run the step again.
        until: DateTime<Utc>,
        /// What is to be approved, in words; recorded in the run's history.
        reason: String,
    },
    /// Held by a closed (or unknown) gate: check again at `retry_at`, and halt the run once
    /// the gate has been closed for `halt_after`.
    Blocked {
        /// What holds it, one line each.
        reasons: Vec<String>,
        /// When to check the gate again.
        retry_at: DateTime<Utc>,
    },
}

impl StepOutcome {
    /// Done, with `note`.
    pub fn done(note: impl Into<String>) -> Self {
        Self::Done {
            note: note.into(),
            learned: None,
        }
    }

    /// Done, with `note`, having learned `learned`.
    pub fn learned(note: impl Into<String>, learned: Learned) -> Self {
        Self::Done {
            note: note.into(),
            learned: Some(learned),
        }
    }

    /// Failed with `error`, worth retrying.
    pub fn retry(error: impl std::fmt::Display) -> Self {
        Self::Retry {
            error: error.to_string(),
        }
    }

    /// `then`, having found `findings`.
    pub fn judged(findings: Vec<Finding>, then: StepOutcome) -> Self {
        Self::Judged {
            findings,
            then: Box::new(then),
        }
    }

    /// Failed for good with `error`.
    pub fn failed(error: impl std::fmt::Display) -> Self {
        Self::Failed {
            error: error.to_string(),
        }
    }
}

/// What the engine is fed.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Start a queued run (or re-check whether it can start).
    Start,
    /// The step started at `epoch` ended.
    StepFinished {
        /// The epoch the step was started with.
        epoch: u64,
        /// How it ended.
        outcome: StepOutcome,
    },
    /// A timer scheduled at `epoch` fired; also used to redo a step in hand after a crash.
    Wake {
        /// The epoch the wake was scheduled with.
        epoch: u64,
    },
    /// An operator's control.
    Control {
        /// Halt, resume or abort.
        action: ControlAction,
        /// Why, in words; recorded in the run's history.
        reason: String,
        /// Who asked: the API client or the AMQP source; credited in the history.
        by: Option<String>,
    },
}

/// What the worker must do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Nothing.
    Nothing,
    /// Run step `index`, then feed back `StepFinished { epoch, .. }`.
    RunStep {
        /// Its index in the run's steps.
        index: usize,
        /// The epoch to report with.
        epoch: u64,
    },
    /// Feed back `Wake { epoch }` at `at`.
    WakeAt {
        /// The earliest time the wake may be delivered.
        at: DateTime<Utc>,
        /// The epoch to report with.
        epoch: u64,
    },
    /// Several of the above, each on its own: the steps of a batch's workers.
    All(Vec<Next>),
}

impl Next {
    /// `nexts` as one: nothing, the one, or all of them.
    pub fn all(nexts: impl IntoIterator<Item = Next>) -> Self {
        let mut nexts: Vec<Next> = nexts.into_iter().flat_map(Next::into_each).collect();
        match nexts.len() {
            0 => Self::Nothing,
            1 => nexts.remove(0),
            _ => Self::All(nexts),
        }
    }

    /// Each step to run and each wake, one by one.
    pub fn into_each(self) -> Vec<Next> {
        match self {
            Self::Nothing => Vec::new(),
            Self::All(nexts) => nexts.into_iter().flat_map(Next::into_each).collect(),
            one => vec![one],
        }
    }
}

/// A control that the run's status does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {action} a run that is {status}{hint}")]
pub struct NotAllowed {
    /// The control that was refused.
    pub action: ControlAction,
    /// The run's status.
    pub status: RunStatus,
    hint: &'static str,
}

/// The reason recorded when a run's kind has nothing to execute it yet.
pub const NO_EXECUTOR: &str = "no executor for this run kind yet";

/// Whether `action` is allowed for `run` now. Checked at the API (409) and again when the
/// control is applied.
pub fn check_control(run: &Run, action: ControlAction) -> Result<(), NotAllowed> {
    let hint = match (action, run.status) {
        (_, s) if s.is_terminal() => " (it has ended)",
        (ControlAction::Halt, RunStatus::Halted) => " (it is already halted)",
        (ControlAction::Halt, RunStatus::Running) if run.halt_requested => {
            " (a halt is already pending)"
        }
        (ControlAction::Resume, RunStatus::Halted) => return Ok(()),
        (ControlAction::Resume, _) => " (only a halted run can be resumed)",
        (ControlAction::Approve, RunStatus::Waiting) if awaiting_approval(run).is_some() => {
            return Ok(());
        }
        (ControlAction::Approve, _) => " (it does not wait for an approval)",
        _ => return Ok(()),
    };
    Err(NotAllowed {
        action,
        status: run.status,
        hint,
    })
}

/// Applies `input` to `run` and says what to do next.
pub fn advance(run: &mut Run, input: Input, ctx: &Context) -> Result<Next, NotAllowed> {
    run.adopt_single_step_in_hand();
    match input {
        Input::Start => Ok(match run.status {
            RunStatus::Queued => start(run, ctx),
            _ => Next::Nothing,
        }),
        Input::Control { action, reason, by } => {
            check_control(run, action)?;
            let since = run.history_len();
            let next = control(run, action, reason, by.as_deref(), ctx);
            if let Some(by) = &by {
                run.credit(since, by);
            }
            Ok(next)
        }
        Input::Wake { epoch } => Ok(wake(run, epoch, ctx)),
        Input::StepFinished { epoch, outcome } => Ok(step_finished(run, epoch, outcome, ctx)),
    }
}

/// How the outcome of a step waiting for an operator's approval reads.
pub const AWAITS_APPROVAL: &str = "waits for approval";

/// The step in hand that waits for an approval, if one does: only such a run may be
/// approved.
fn awaiting_approval(run: &Run) -> Option<usize> {
    run.in_hand
        .iter()
        .copied()
        .find(|&i| run.steps.get(i).is_some_and(|s| s.is_held(Held::Approval)))
}

/// How the outcome of a step held by a closed gate reads: its blockers follow.
const GATE_CLOSED: &str = "gate closed: ";

fn start(run: &mut Run, ctx: &Context) -> Next {
    proceed(run, ctx, false)
}

/// Whether step `index` needs nothing more: done, or in the cycle of a worker left behind.
fn settled(run: &Run, index: usize) -> bool {
    let step = &run.steps[index];
    step.status == StepStatus::Done
        || step
            .kind
            .lane()
            .is_some_and(|lane| lane_left_behind(run, lane))
}

fn lane_left_behind(run: &Run, lane: &str) -> bool {
    run.left_behind
        .iter()
        .any(|&i| run.steps.get(i).and_then(|s| s.kind.lane()) == Some(lane))
}

/// Moves the cursor past the settled steps; it never moves back except on a resume.
fn advance_cursor(run: &mut Run) {
    while run.cursor < run.steps.len()
        && !run.in_hand.contains(&run.cursor)
        && settled(run, run.cursor)
    {
        run.cursor += 1;
    }
}

/// The steps that may start now and are not in hand: the step at the cursor when it runs
/// alone; in a batch of workers, the next step of each worker's cycle. Only the batch is
/// looked at, never the whole plan.
fn ready_steps(run: &Run) -> Vec<usize> {
    let cursor = run.cursor;
    let Some(step) = run.steps.get(cursor) else {
        return Vec::new();
    };
    if step.kind.lane().is_none() {
        return if run.in_hand.contains(&cursor) {
            Vec::new()
        } else {
            vec![cursor]
        };
    }
    let mut met = std::collections::HashSet::new();
    let mut ready = Vec::new();
    for (index, step) in run.steps.iter().enumerate().skip(cursor) {
        let Some(lane) = step.kind.lane() else { break };
        if met.contains(lane) || step.status == StepStatus::Done {
            continue;
        }
        met.insert(lane);
        if !lane_left_behind(run, lane) && !run.in_hand.contains(&index) {
            ready.push(index);
        }
    }
    ready
}

/// Starts what may start now; ends the run when nothing is left. `via_queue`: a gate is
/// started through the queue (see `step_done`).
fn proceed(run: &mut Run, ctx: &Context, via_queue: bool) -> Next {
    advance_cursor(run);
    let ready = ready_steps(run);
    let Some(&first) = ready.first() else {
        if run.in_hand.is_empty() && run.cursor >= run.steps.len() {
            return finish(run, ctx);
        }
        // The rest of the batch is in hand; when none of it runs, the run waits on it.
        if !run.steps_in_hand().any(|s| s.status == StepStatus::Running) {
            let waiting: Vec<String> = run.steps_in_hand().map(Step::label).collect();
            run.transition(
                RunStatus::Waiting,
                format!("waiting on {}", waiting.join(", ")),
                ctx.now,
            );
        }
        return Next::Nothing;
    };
    if run.steps[first].kind.lane().is_none() {
        if !run.left_behind.is_empty() && !run.steps[first].kind.among_workers() {
            run.current_step = Some(first);
            hold(run, left_behind_reason(run), ctx);
            return Next::Nothing;
        }
        if !(ctx.can_execute)(&run.steps[first]) {
            run.current_step = Some(first);
            let reason = format!("{NO_EXECUTOR} (next step: {})", run.steps[first].label());
            run.transition(RunStatus::Queued, reason, ctx.now);
            return Next::Nothing;
        }
        if via_queue && first > 0 && first == run.steps_outside_the_cluster() {
            // It waited outside the cluster (a fleet wave's upstreams) and now needs the
            // cluster's lock, which is taken through the queue, where the worker sees the
            // other runs: queued, with a wake now.
            run.current_step = Some(first);
            run.epoch += 1;
            run.wake_at = Some(ctx.now);
            let reason = format!(
                "{TAKES_THE_CLUSTER} (next step: {})",
                run.steps[first].label()
            );
            run.transition(RunStatus::Queued, reason, ctx.now);
            return Next::WakeAt {
                at: ctx.now,
                epoch: run.epoch,
            };
        }
        if via_queue && run.steps[first].kind.is_gate() {
            // A gate is asked only from the queue: alerts that arrived while earlier steps
            // ran are on the board by then, so a gate never reads a board that is behind.
            run.current_step = Some(first);
            run.epoch += 1;
            let epoch = run.epoch;
            run.step_mut(first).epoch = epoch;
            run.in_hand.push(first);
            run.wake_at = Some(ctx.now);
            return Next::WakeAt {
                at: ctx.now,
                epoch: run.epoch,
            };
        }
        return run_step(run, first, ctx);
    }
    Next::all(ready.into_iter().map(|index| run_step(run, index, ctx)))
}

/// How a run that leaves its wait outside the cluster says it now takes the cluster's lock.
pub const TAKES_THE_CLUSTER: &str = "takes the cluster";

/// Every step is done or left behind: the run succeeds, or holds naming who is behind.
fn finish(run: &mut Run, ctx: &Context) -> Next {
    if run.left_behind.is_empty() {
        run.current_step = None;
        run.transition(RunStatus::Succeeded, "every step done", ctx.now);
    } else {
        hold(run, left_behind_reason(run), ctx);
    }
    Next::Nothing
}

/// The last step of a run with workers left behind: each named with what it needs.
fn left_behind_reason(run: &Run) -> String {
    let each: Vec<String> = run
        .left_behind
        .iter()
        .map(|&i| {
            let step = &run.steps[i];
            format!(
                "{} ({} gave up: {})",
                step.kind.lane().unwrap_or("?"),
                step.label(),
                step.outcome.as_deref().unwrap_or("no outcome")
            )
        })
        .collect();
    format!(
        "{} worker(s) left behind, each cordoned: {}; fix them and resume to retry exactly these, or abort to leave them cordoned",
        each.len(),
        each.join("; ")
    )
}

fn run_step(run: &mut Run, index: usize, ctx: &Context) -> Next {
    run.current_step = Some(index);
    run.wake_at = None;
    run.epoch += 1;
    if !run.in_hand.contains(&index) {
        run.in_hand.push(index);
    }
    let epoch = run.epoch;
    let step = run.step_mut(index);
    step.epoch = epoch;
    step.wake_at = None;
    step.status = StepStatus::Running;
    step.held = None;
    step.attempts += 1;
    step.started_at.get_or_insert(ctx.now);
    let reason = format!("step {} (attempt {})", step.label(), step.attempts);
    run.transition(RunStatus::Running, reason, ctx.now);
    Next::RunStep {
        index,
        epoch: run.epoch,
    }
}

/// Whether a step in hand other than `index` is running.
fn others_running(run: &Run, index: usize) -> bool {
    run.in_hand
        .iter()
        .any(|&i| i != index && run.steps[i].status == StepStatus::Running)
}

/// Step `index` comes back at `at`; the run waits when nothing else is running.
fn schedule_wake(
    run: &mut Run,
    index: usize,
    at: DateTime<Utc>,
    reason: String,
    ctx: &Context,
) -> Next {
    run.epoch += 1;
    let epoch = run.epoch;
    let step = run.step_mut(index);
    step.epoch = epoch;
    step.wake_at = Some(at);
    if others_running(run, index) {
        run.note(reason, ctx.now);
    } else {
        run.wake_at = Some(at);
        run.transition(RunStatus::Waiting, reason, ctx.now);
    }
    Next::WakeAt {
        at,
        epoch: run.epoch,
    }
}

fn hold(run: &mut Run, reason: String, ctx: &Context) {
    run.epoch += 1;
    run.wake_at = None;
    run.in_hand.clear();
    run.halt_requested = false;
    run.halt_requested_by = None;
    run.halt_pending = None;
    run.transition(RunStatus::Halted, reason, ctx.now);
}

/// Holds for `reason` once no other step in hand is running; until then the steps in hand
/// finish and no new one starts.
fn hold_when_idle(run: &mut Run, index: usize, reason: String, ctx: &Context) -> Next {
    if others_running(run, index) {
        run.halt_requested = true;
        run.note(
            format!("{reason} (halting once the steps in hand have finished)"),
            ctx.now,
        );
        run.halt_pending = Some(reason);
        return Next::Nothing;
    }
    hold(run, reason, ctx);
    Next::Nothing
}

/// A halt is pending and step `index` has finished: holds once nothing else runs.
fn halt_after_step(run: &mut Run, index: usize, detail: String, ctx: &Context) -> Next {
    run.in_hand.retain(|&i| i != index);
    if others_running(run, index) {
        return Next::Nothing;
    }
    if let Some(reason) = run.halt_pending.take() {
        hold(run, reason, ctx);
        return Next::Nothing;
    }
    let by = run.halt_requested_by.take();
    let since = run.history_len();
    let who = by.as_deref().unwrap_or("operator");
    hold(run, format!("halted by {who} {detail}"), ctx);
    if let Some(by) = &by {
        run.credit(since, by);
    }
    Next::Nothing
}

/// The nodes a run leaves cordoned when it stops now: those of the batch at the cursor
/// whose cycle has begun and not ended, and those left behind.
fn nodes_in_hand(run: &Run) -> Vec<String> {
    let (start, end) = (segment_start(run, run.cursor), segment_end(run, run.cursor));
    // Per worker: whether its cycle has begun, and whether its last step is done.
    let mut cycles: Vec<(&str, bool, bool)> = Vec::new();
    for step in run.steps.range(start..end) {
        let Some(lane) = step.kind.lane() else {
            continue;
        };
        let at = match cycles.iter().position(|(l, ..)| *l == lane) {
            Some(at) => at,
            None => {
                cycles.push((lane, false, false));
                cycles.len() - 1
            }
        };
        cycles[at].1 |= step.status != StepStatus::Pending;
        cycles[at].2 = step.status == StepStatus::Done;
    }
    let mut nodes: Vec<String> = cycles
        .into_iter()
        .filter(|(_, begun, ended)| *begun && !*ended)
        .map(|(lane, ..)| lane.to_owned())
        .collect();
    nodes.extend(run.workers_left_behind().map(str::to_owned));
    nodes.sort();
    nodes.dedup();
    nodes
}

/// Makes the steps a halted run held (in hand, given up, or left behind) pending again,
/// with fresh attempts and a fresh clock, and the gate and soak of each batch a worker
/// left behind is retried in; the cursor goes back to the first of them.
fn reset_for_resume(run: &mut Run) {
    let mut again: Vec<usize> = Vec::new();
    let end = segment_end(run, run.cursor);
    again.extend((run.cursor..end).filter(|&i| {
        matches!(
            run.steps[i].status,
            StepStatus::Running | StepStatus::Waiting | StepStatus::Failed
        )
    }));
    for &failed in &run.left_behind {
        again.push(failed);
        let start = segment_start(run, failed);
        if start > 0 && run.steps[start - 1].kind.is_gate() {
            again.push(start - 1);
        }
        let end = segment_end(run, failed);
        if end < run.steps.len() && run.steps[end].kind.is_soak() {
            again.push(end);
        }
    }
    for &i in &again {
        let step = run.step_mut(i);
        step.attempts = 0;
        step.status = StepStatus::Pending;
        step.started_at = None;
        step.ended_at = None;
    }
    if let Some(&first) = again.iter().min() {
        run.cursor = run.cursor.min(first);
    }
    run.left_behind.clear();
    run.in_hand.clear();
}

/// The first index of the batch step `index` is in (itself when it runs alone).
fn segment_start(run: &Run, index: usize) -> usize {
    let mut start = index;
    while start > 0
        && run.steps[index].kind.lane().is_some()
        && run.steps[start - 1].kind.lane().is_some()
    {
        start -= 1;
    }
    start
}

/// One past the last index of the batch step `index` is in.
fn segment_end(run: &Run, index: usize) -> usize {
    if run.steps.get(index).is_none_or(|s| s.kind.lane().is_none()) {
        return (index + 1).min(run.steps.len());
    }
    let mut end = index;
    while end < run.steps.len() && run.steps[end].kind.lane().is_some() {
        end += 1;
    }
    end
}

fn control(
    run: &mut Run,
    action: ControlAction,
    reason: String,
    by: Option<&str>,
    ctx: &Context,
) -> Next {
    let who = by.unwrap_or("operator");
    let reason = if reason.is_empty() {
        format!("{action} by {who}")
    } else {
        format!("{action} by {who}: {reason}")
    };
    match action {
        ControlAction::Halt if run.status == RunStatus::Running => {
            // The steps in hand finish first; the last outcome applies the halt.
            run.halt_requested = true;
            run.halt_requested_by = by.map(str::to_owned);
            let running = run
                .steps_in_hand()
                .filter(|s| s.status == StepStatus::Running)
                .count();
            let after = if running > 1 {
                format!("after the {running} steps in hand")
            } else {
                "after the step in hand".to_owned()
            };
            run.note(format!("{reason} ({after})"), ctx.now);
            Next::Nothing
        }
        ControlAction::Halt => {
            hold(run, reason, ctx);
            Next::Nothing
        }
        ControlAction::Approve => {
            run.approved_by = Some(who.to_owned());
            run.note(reason, ctx.now);
            // The step that waits for it goes on now, not at its next poll.
            match awaiting_approval(run) {
                Some(index) => wake(run, run.steps[index].epoch, ctx),
                None => Next::Nothing,
            }
        }
        ControlAction::Resume => {
            // A fresh halt_after window: the operator has looked at the blockers.
            run.blocked_since = None;
            reset_for_resume(run);
            run.transition(RunStatus::Queued, reason, ctx.now);
            start(run, ctx)
        }
        ControlAction::Abort => {
            let cordoned = nodes_in_hand(run);
            run.epoch += 1;
            run.wake_at = None;
            run.in_hand.clear();
            run.halt_requested = false;
            run.halt_requested_by = None;
            run.halt_pending = None;
            let reason = if cordoned.is_empty() {
                reason
            } else {
                format!(
                    "{reason}; left as they are, possibly cordoned: {}",
                    cordoned.join(", ")
                )
            };
            run.transition(RunStatus::Aborted, reason, ctx.now);
            Next::Nothing
        }
    }
}

/// The step in hand that `epoch` was issued to, if it still is.
fn in_hand_with(run: &Run, epoch: u64) -> Option<usize> {
    run.in_hand
        .iter()
        .copied()
        .find(|&i| run.steps.get(i).is_some_and(|s| s.epoch == epoch))
}

fn wake(run: &mut Run, epoch: u64, ctx: &Context) -> Next {
    if !matches!(run.status, RunStatus::Waiting | RunStatus::Running) {
        return Next::Nothing;
    }
    let Some(index) = in_hand_with(run, epoch) else {
        return Next::Nothing;
    };
    run.current_step = Some(index);
    if run.halt_requested {
        let label = run.steps[index].label();
        return halt_after_step(run, index, format!("at step {label}"), ctx);
    }
    if !(ctx.can_execute)(&run.steps[index]) {
        // E.g. restarted with a configuration that no longer executes this step.
        run.epoch += 1;
        run.wake_at = None;
        run.in_hand.clear();
        run.step_mut(index).status = StepStatus::Pending;
        let reason = format!("{NO_EXECUTOR} (next step: {})", run.steps[index].label());
        run.transition(RunStatus::Queued, reason, ctx.now);
        return Next::Nothing;
    }
    run_step(run, index, ctx)
}

fn step_done(run: &mut Run, index: usize, note: String, ctx: &Context) -> Next {
    let step = run.step_mut(index);
    let label = step.label();
    step.status = StepStatus::Done;
    step.ended_at = Some(ctx.now);
    step.outcome = Some(note);
    let still_held = run.steps_in_hand().any(|s| s.is_held(Held::Gate));
    if !still_held {
        run.blockers.clear();
        if let Some(since) = run.blocked_since.take() {
            let held = (ctx.now - since).num_seconds();
            run.note(
                format!("gate open again after {held}s: step {label} done"),
                ctx.now,
            );
        }
    }
    if run.halt_requested {
        return halt_after_step(run, index, format!("after step {label}"), ctx);
    }
    run.in_hand.retain(|&i| i != index);
    proceed(run, ctx, true)
}

fn step_finished(run: &mut Run, epoch: u64, outcome: StepOutcome, ctx: &Context) -> Next {
    if run.status != RunStatus::Running {
        return Next::Nothing;
    }
    let Some(index) =
        in_hand_with(run, epoch).filter(|&i| run.steps[i].status == StepStatus::Running)
    else {
        return Next::Nothing;
    };
    run.current_step = Some(index);
    let max_attempts = ctx.max_attempts.max(1);
    let step = run.step_mut(index);
    step.held = None;
    let label = step.label();
    match outcome {
        StepOutcome::Judged { findings, then } => {
            step.findings = findings;
            step_finished(run, epoch, *then, ctx)
        }
        StepOutcome::Done { note, learned } => {
            if let Some(learned) = learned {
                run.memory.keep(learned);
            }
            step_done(run, index, note, ctx)
        }
        StepOutcome::Planned { note, steps } => {
            run.steps.truncate(index + 1);
            run.steps.extend(steps);
            run.touch_all_steps();
            step_done(run, index, note, ctx)
        }
        StepOutcome::Announced { note } => {
            run.note(note.clone(), ctx.now);
            step_done(run, index, note, ctx)
        }
        StepOutcome::SkipCycle { note } => {
            if let Some(lane) = run.steps[index].kind.lane().map(str::to_owned) {
                for i in index + 1..segment_end(run, index) {
                    if run.steps[i].kind.lane() == Some(lane.as_str())
                        && run.steps[i].status == StepStatus::Pending
                    {
                        let skipped = run.step_mut(i);
                        skipped.status = StepStatus::Done;
                        skipped.ended_at = Some(ctx.now);
                        skipped.outcome = Some(format!("skipped: {note}"));
                    }
                }
            }
            step_done(run, index, note, ctx)
        }
        StepOutcome::Replanned { note, steps } => {
            let stage = run.steps[index].kind.stage_name();
            let end = run
                .steps
                .range(index + 1..)
                .position(|s| s.kind.stage_name() != stage)
                .map_or(run.steps.len(), |p| index + 1 + p);
            run.steps.splice(index + 1..end, steps);
            run.touch_all_steps();
            step_done(run, index, note, ctx)
        }
        StepOutcome::Wait { until, reason } => step_waits(run, index, until, reason, None, ctx),
        StepOutcome::AwaitApproval { until, reason } => {
            step_waits(run, index, until, reason, Some(Held::Approval), ctx)
        }
        StepOutcome::Retry { error } if step.attempts < max_attempts => {
            step.status = StepStatus::Waiting;
            step.outcome = Some(error.clone());
            let attempts = step.attempts;
            if run.halt_requested {
                return halt_after_step(run, index, format!("at step {label}: {error}"), ctx);
            }
            let reason = format!(
                "step {label} failed (attempt {attempts} of {max_attempts}), retrying: {error}"
            );
            let pause = ctx.retry.pause(attempts, ctx.jitter);
            let at = ctx.now + chrono::Duration::from_std(pause).unwrap_or(chrono::Duration::MAX);
            schedule_wake(run, index, at, reason, ctx)
        }
        StepOutcome::Blocked { reasons, retry_at } => {
            step.status = StepStatus::Waiting;
            step.held = Some(Held::Gate);
            let summary = reasons.join("; ");
            step.outcome = Some(format!("{GATE_CLOSED}{summary}"));
            let since = *run.blocked_since.get_or_insert(ctx.now);
            run.blockers = reasons;
            let held = ctx.now - since;
            if held >= ctx.halt_after {
                let reason = format!(
                    "gate closed for {}s at step {label} (halt_after {}s): {summary}",
                    held.num_seconds(),
                    ctx.halt_after.num_seconds()
                );
                return hold_when_idle(run, index, reason, ctx);
            }
            if run.halt_requested {
                return halt_after_step(
                    run,
                    index,
                    format!("at step {label}: gate closed: {summary}"),
                    ctx,
                );
            }
            schedule_wake(
                run,
                index,
                retry_at,
                format!("gate closed at step {label}: {summary}"),
                ctx,
            )
        }
        StepOutcome::Halt { reason } => {
            step.status = StepStatus::Failed;
            step.ended_at = Some(ctx.now);
            step.outcome = Some(reason.clone());
            run.in_hand.retain(|&i| i != index);
            hold_when_idle(run, index, format!("step {label}: {reason}"), ctx)
        }
        StepOutcome::Retry { error, .. } | StepOutcome::Failed { error } => {
            step.status = StepStatus::Failed;
            step.ended_at = Some(ctx.now);
            step.outcome = Some(error.clone());
            let reason = format!(
                "step {label} gave up after {} attempt(s): {error}",
                step.attempts
            );
            run.in_hand.retain(|&i| i != index);
            if let Some(lane) = run.steps[index].kind.lane().map(str::to_owned) {
                return worker_failed(run, index, &lane, reason, ctx);
            }
            match run.on_failure {
                super::run::FailurePolicy::Halt => hold_when_idle(run, index, reason, ctx),
                super::run::FailurePolicy::Fail => {
                    run.epoch += 1;
                    run.in_hand.clear();
                    run.transition(RunStatus::Failed, reason, ctx.now);
                    Next::Nothing
                }
            }
        }
    }
}

/// Step `index` waits until `until` for `reason`, held by `held` if anything holds it but
/// its own clock.
fn step_waits(
    run: &mut Run,
    index: usize,
    until: DateTime<Utc>,
    reason: String,
    held: Option<Held>,
    ctx: &Context,
) -> Next {
    let step = run.step_mut(index);
    let label = step.label();
    step.status = StepStatus::Waiting;
    step.outcome = Some(reason.clone());
    step.held = held;
    // A wait is not a closed gate (a maintenance window closed): the clock of halt_after
    // starts again when the gate is next asked.
    run.blockers.clear();
    run.blocked_since = None;
    if run.halt_requested {
        return halt_after_step(run, index, format!("at step {label}: {reason}"), ctx);
    }
    schedule_wake(run, index, until, format!("step {label}: {reason}"), ctx)
}

/// A worker's cycle gave up at step `index`: within the failure budget it is left behind,
/// cordoned, and the others go on; past it the run halts (or fails, by its policy) once
/// the steps in hand have finished.
fn worker_failed(run: &mut Run, index: usize, lane: &str, reason: String, ctx: &Context) -> Next {
    let workers: std::collections::HashSet<&str> =
        run.steps.iter().filter_map(|s| s.kind.lane()).collect();
    let budget = ctx.failure_budget.of(workers.len());
    let failed = run.left_behind.len() + 1;
    if failed <= budget {
        run.left_behind.push(index);
        run.note(
            format!(
                "{reason}; {lane} is left behind, cordoned ({failed} of the failure budget's {budget} used); the others go on"
            ),
            ctx.now,
        );
        if run.halt_requested {
            return halt_after_step(run, index, format!("after {lane} was left behind"), ctx);
        }
        return proceed(run, ctx, true);
    }
    let reason = if budget == 0 {
        reason
    } else {
        format!("{reason}; failure budget ({budget} worker(s)) used up")
    };
    match run.on_failure {
        super::run::FailurePolicy::Halt => {
            run.left_behind.push(index);
            hold_when_idle(run, index, reason, ctx)
        }
        super::run::FailurePolicy::Fail => {
            run.epoch += 1;
            run.in_hand.clear();
            run.transition(RunStatus::Failed, reason, ctx.now);
            Next::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Stage;
    use crate::domain::run::{FailurePolicy, Steps};
    use crate::domain::upgrade_step::UpgradeStep;
    use chrono::TimeZone;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).single().unwrap()
    }

    fn run_with(steps: &[&str]) -> Run {
        Run::new(
            "r1".into(),
            crate::domain::upgrade_step::K8S_UPGRADE,
            serde_json::json!({}),
            Some("1.34.5".into()),
            steps.iter().map(|s| step(s)).collect(),
            t(0),
            "accepted",
        )
    }

    /// A step called `name`: the real kind of that name, or a node step on node `name`.
    fn step(name: &str) -> Step {
        let node = || "n1".to_owned();
        Step::new(match name {
            "plan" => UpgradeStep::Plan,
            "upstreams" => UpgradeStep::Upstreams,
            "nodes-ready" => UpgradeStep::NodesReady,
            "gate" => UpgradeStep::Gate {
                stage: Stage::Workers,
                node: Some(node()),
            },
            "drain" => UpgradeStep::Drain {
                stage: Stage::Workers,
                node: node(),
            },
            "upgrade" => UpgradeStep::Upgrade {
                stage: Stage::Workers,
                node: node(),
            },
            other => UpgradeStep::Soak {
                stage: Stage::Workers,
                node: other.into(),
            },
        })
    }

    fn any(_: &Step) -> bool {
        true
    }

    fn none(_: &Step) -> bool {
        false
    }

    fn ctx(secs: i64) -> Context<'static> {
        Context {
            now: t(secs),
            can_execute: &any,
            max_attempts: 3,
            halt_after: chrono::Duration::seconds(100),
            retry: Backoff::new(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(60),
            ),
            jitter: 1.0,
            failure_budget: FailureBudget::None,
        }
    }

    fn done() -> StepOutcome {
        StepOutcome::done("ok")
    }

    fn control(action: ControlAction) -> Input {
        Input::Control {
            action,
            reason: String::new(),
            by: None,
        }
    }

    /// Feeds inputs in order; each row gives the input, the status after, and the next action.
    fn script(run: &mut Run, rows: Vec<(Input, RunStatus, Next)>) {
        for (i, (input, status, next)) in rows.into_iter().enumerate() {
            let got = advance(run, input.clone(), &ctx(i as i64 + 1))
                .unwrap_or_else(|e| panic!("row {i} ({input:?}): {e}"));
            assert_eq!(got, next, "row {i} ({input:?}) next");
            assert_eq!(run.status, status, "row {i} ({input:?}) status");
        }
    }

    #[test]
    fn a_run_without_executor_stays_queued_with_the_reason() {
        let mut run = run_with(&["preflight"]);
        let ctx = Context {
            can_execute: &none,
            ..ctx(1)
        };
        assert_eq!(advance(&mut run, Input::Start, &ctx), Ok(Next::Nothing));
        assert_eq!(run.status, RunStatus::Queued);
        assert_eq!(
            run.reason,
            format!("{NO_EXECUTOR} (next step: workers/soak@preflight)")
        );
        assert_eq!(run.history.len(), 2);
        advance(&mut run, Input::Start, &ctx).unwrap();
        assert_eq!(
            run.history.len(),
            2,
            "the same reason is not recorded twice"
        );
    }

    #[test]
    fn steps_run_in_order_to_success() {
        let mut run = run_with(&["a", "b"]);
        script(
            &mut run,
            vec![
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 1 },
                ),
                (
                    Input::StepFinished {
                        epoch: 1,
                        outcome: done(),
                    },
                    RunStatus::Running,
                    Next::RunStep { index: 1, epoch: 2 },
                ),
                (
                    Input::StepFinished {
                        epoch: 2,
                        outcome: done(),
                    },
                    RunStatus::Succeeded,
                    Next::Nothing,
                ),
            ],
        );
        assert!(
            run.steps
                .iter()
                .all(|s| s.status == StepStatus::Done && s.attempts == 1)
        );
    }

    #[test]
    fn a_run_leaving_its_wait_outside_the_cluster_takes_the_lock_through_the_queue() {
        let mut run = run_with(&["upstreams", "plan"]);
        assert!(!run.holds_cluster(), "a run at its upstreams holds nothing");
        script(
            &mut run,
            vec![
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 1 },
                ),
                (
                    Input::StepFinished {
                        epoch: 1,
                        outcome: done(),
                    },
                    RunStatus::Queued,
                    Next::WakeAt { at: t(2), epoch: 2 },
                ),
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 1, epoch: 3 },
                ),
            ],
        );
        assert!(run.holds_cluster());
        assert!(
            run.history
                .iter()
                .any(|h| h.reason == "takes the cluster (next step: plan)"),
            "{:?}",
            run.history
        );
    }

    #[test]
    fn only_a_run_waiting_for_an_approval_takes_one_and_it_goes_on_at_once() {
        let mut run = run_with(&["upstreams", "b"]);
        let approve = |by: &str| Input::Control {
            action: ControlAction::Approve,
            reason: String::new(),
            by: Some(by.into()),
        };
        advance(&mut run, Input::Start, &ctx(1)).unwrap();
        // Held by its upstreams, not yet by an approval: nothing to approve.
        let upstreams = StepOutcome::Wait {
            until: t(60),
            reason: "waits for upstreams: staging: soaking until …".into(),
        };
        let at = |epoch| Input::StepFinished {
            epoch,
            outcome: upstreams.clone(),
        };
        advance(&mut run, at(1), &ctx(2)).unwrap();
        let refused = advance(&mut run, approve("ops"), &ctx(3)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "cannot approve a run that is waiting (it does not wait for an approval)"
        );
        assert_eq!(run.approved_by, None);
        // Words are not a state: a plain wait that reads like an approval is not one.
        advance(&mut run, Input::Wake { epoch: 2 }, &ctx(4)).unwrap();
        let lookalike = StepOutcome::Wait {
            until: t(60),
            reason: format!("{AWAITS_APPROVAL}: in words only"),
        };
        advance(
            &mut run,
            Input::StepFinished {
                epoch: 3,
                outcome: lookalike,
            },
            &ctx(4),
        )
        .unwrap();
        assert!(advance(&mut run, approve("ops"), &ctx(4)).is_err());
        advance(&mut run, Input::Wake { epoch: 4 }, &ctx(4)).unwrap();
        let approval = StepOutcome::AwaitApproval {
            until: t(90),
            reason: format!("{AWAITS_APPROVAL}: upstreams ready (staging)"),
        };
        let next = advance(
            &mut run,
            Input::StepFinished {
                epoch: 5,
                outcome: approval,
            },
            &ctx(5),
        )
        .unwrap();
        assert_eq!(
            next,
            Next::WakeAt {
                at: t(90),
                epoch: 6
            }
        );
        // Approved: the step runs again now, not at its next poll, and the approver is
        // credited.
        let next = advance(&mut run, approve("approver"), &ctx(6)).unwrap();
        assert_eq!(next, Next::RunStep { index: 0, epoch: 7 });
        assert_eq!(run.approved_by.as_deref(), Some("approver"));
        assert!(
            run.history
                .iter()
                .any(|h| h.reason == "approve by approver" && h.by.as_deref() == Some("approver"))
        );
        let announced = StepOutcome::Announced {
            note: "wave promotes 1.34.5 to prod: staging ran it".into(),
        };
        let next = advance(
            &mut run,
            Input::StepFinished {
                epoch: 7,
                outcome: announced,
            },
            &ctx(7),
        )
        .unwrap();
        // Past its upstreams the run takes the cluster's lock through the queue.
        assert_eq!(next, Next::WakeAt { at: t(7), epoch: 8 });
        assert_eq!(run.status, RunStatus::Queued);
        assert!(
            run.history
                .iter()
                .any(|h| h.reason == "wave promotes 1.34.5 to prod: staging ran it"),
            "an announced step is told in the history"
        );
        assert!(advance(&mut run, approve("approver"), &ctx(8)).is_err());
    }

    #[test]
    fn wait_schedules_a_wake_and_the_wake_reruns_the_step() {
        let mut run = run_with(&["gate"]);
        let wait = StepOutcome::Wait {
            until: t(30),
            reason: "gate closed".into(),
        };
        script(
            &mut run,
            vec![
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 1 },
                ),
                (
                    Input::StepFinished {
                        epoch: 1,
                        outcome: wait,
                    },
                    RunStatus::Waiting,
                    Next::WakeAt {
                        at: t(30),
                        epoch: 2,
                    },
                ),
                (Input::Wake { epoch: 1 }, RunStatus::Waiting, Next::Nothing),
                (
                    Input::Wake { epoch: 2 },
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 3 },
                ),
                (
                    Input::StepFinished {
                        epoch: 2,
                        outcome: done(),
                    },
                    RunStatus::Running,
                    Next::Nothing,
                ),
                (
                    Input::StepFinished {
                        epoch: 3,
                        outcome: done(),
                    },
                    RunStatus::Succeeded,
                    Next::Nothing,
                ),
            ],
        );
        assert_eq!(run.wake_at, None);
    }

    #[test]
    fn retries_until_attempts_are_used_then_follows_the_policy() {
        for (policy, end) in [
            (FailurePolicy::Halt, RunStatus::Halted),
            (FailurePolicy::Fail, RunStatus::Failed),
        ] {
            let mut run = run_with(&["drain"]);
            run.on_failure = policy;
            let retry = || StepOutcome::retry("429");
            script(
                &mut run,
                vec![
                    (
                        Input::Start,
                        RunStatus::Running,
                        Next::RunStep { index: 0, epoch: 1 },
                    ),
                    (
                        Input::StepFinished {
                            epoch: 1,
                            outcome: retry(),
                        },
                        RunStatus::Waiting,
                        Next::WakeAt {
                            // At t(2), after 1 failure: the full 10s step (jitter 1.0).
                            at: t(12),
                            epoch: 2,
                        },
                    ),
                    (
                        Input::Wake { epoch: 2 },
                        RunStatus::Running,
                        Next::RunStep { index: 0, epoch: 3 },
                    ),
                    (
                        Input::StepFinished {
                            epoch: 3,
                            outcome: retry(),
                        },
                        RunStatus::Waiting,
                        Next::WakeAt {
                            // At t(4), after 2 failures: doubled.
                            at: t(24),
                            epoch: 4,
                        },
                    ),
                    (
                        Input::Wake { epoch: 4 },
                        RunStatus::Running,
                        Next::RunStep { index: 0, epoch: 5 },
                    ),
                    (
                        Input::StepFinished {
                            epoch: 5,
                            outcome: retry(),
                        },
                        end,
                        Next::Nothing,
                    ),
                ],
            );
            assert_eq!(run.steps[0].status, StepStatus::Failed);
            assert!(
                run.reason.contains("gave up after 3 attempt(s): 429"),
                "{}",
                run.reason
            );
        }
    }

    #[test]
    fn a_step_that_finds_a_halt_halts_under_either_policy_and_a_resume_asks_it_again() {
        let criteria = super::super::analysis::Criteria {
            direction: super::super::analysis::Direction::Increase,
            tolerance: 1.2,
            min_samples: 3,
            significance: 0.05,
        };
        let found = Finding::unread("latency", &criteria, "no data for the batch");
        for policy in [FailurePolicy::Halt, FailurePolicy::Fail] {
            let mut run = run_with(&["a", "b"]);
            run.on_failure = policy;
            script(
                &mut run,
                vec![
                    (
                        Input::Start,
                        RunStatus::Running,
                        Next::RunStep { index: 0, epoch: 1 },
                    ),
                    (
                        Input::StepFinished {
                            epoch: 1,
                            outcome: StepOutcome::judged(
                                vec![found.clone()],
                                StepOutcome::Halt {
                                    reason: "latency regressed".into(),
                                },
                            ),
                        },
                        RunStatus::Halted,
                        Next::Nothing,
                    ),
                    (
                        control(ControlAction::Resume),
                        RunStatus::Running,
                        Next::RunStep { index: 0, epoch: 3 },
                    ),
                ],
            );
            assert!(
                run.history
                    .iter()
                    .any(|t| t.reason.contains("latency regressed")),
                "{:?}",
                run.history
            );
            assert_eq!(
                run.steps[0].attempts, 1,
                "fresh attempts: {:?}",
                run.steps[0]
            );
            assert_eq!(
                run.steps[0].findings,
                std::slice::from_ref(&found),
                "kept on the step"
            );
            assert!(run.touched.all || run.touched.steps.contains(&0));
        }
    }

    #[test]
    fn resume_after_a_give_up_gets_fresh_attempts_at_the_same_step() {
        let mut run = run_with(&["a", "b"]);
        script(
            &mut run,
            vec![
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 1 },
                ),
                (
                    Input::StepFinished {
                        epoch: 1,
                        outcome: done(),
                    },
                    RunStatus::Running,
                    Next::RunStep { index: 1, epoch: 2 },
                ),
                (
                    Input::StepFinished {
                        epoch: 2,
                        outcome: StepOutcome::Failed {
                            error: "boom".into(),
                        },
                    },
                    RunStatus::Halted,
                    Next::Nothing,
                ),
                (
                    control(ControlAction::Resume),
                    RunStatus::Running,
                    Next::RunStep { index: 1, epoch: 4 },
                ),
            ],
        );
        assert_eq!(run.steps[1].attempts, 1);
        assert_eq!(run.steps[0].attempts, 1, "a done step is not redone");
    }

    #[test]
    fn halt_while_running_finishes_the_step_then_holds() {
        let mut run = run_with(&["a", "b"]);
        script(
            &mut run,
            vec![
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 1 },
                ),
                (
                    control(ControlAction::Halt),
                    RunStatus::Running,
                    Next::Nothing,
                ),
                (
                    Input::StepFinished {
                        epoch: 1,
                        outcome: done(),
                    },
                    RunStatus::Halted,
                    Next::Nothing,
                ),
                (
                    control(ControlAction::Resume),
                    RunStatus::Running,
                    Next::RunStep { index: 1, epoch: 3 },
                ),
                (
                    Input::StepFinished {
                        epoch: 3,
                        outcome: done(),
                    },
                    RunStatus::Succeeded,
                    Next::Nothing,
                ),
            ],
        );
        assert_eq!(run.steps[0].status, StepStatus::Done);
    }

    #[test]
    fn halt_while_waiting_cancels_the_wake() {
        let mut run = run_with(&["soak"]);
        let wait = StepOutcome::Wait {
            until: t(60),
            reason: "soak".into(),
        };
        script(
            &mut run,
            vec![
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 1 },
                ),
                (
                    Input::StepFinished {
                        epoch: 1,
                        outcome: wait,
                    },
                    RunStatus::Waiting,
                    Next::WakeAt {
                        at: t(60),
                        epoch: 2,
                    },
                ),
                (
                    control(ControlAction::Halt),
                    RunStatus::Halted,
                    Next::Nothing,
                ),
                (Input::Wake { epoch: 2 }, RunStatus::Halted, Next::Nothing),
            ],
        );
    }

    #[test]
    fn abort_ignores_the_late_outcome_of_the_step_in_hand() {
        let mut run = run_with(&["a", "b"]);
        script(
            &mut run,
            vec![
                (
                    Input::Start,
                    RunStatus::Running,
                    Next::RunStep { index: 0, epoch: 1 },
                ),
                (
                    control(ControlAction::Abort),
                    RunStatus::Aborted,
                    Next::Nothing,
                ),
                (
                    Input::StepFinished {
                        epoch: 1,
                        outcome: done(),
                    },
                    RunStatus::Aborted,
                    Next::Nothing,
                ),
            ],
        );
        assert_eq!(run.steps[1].status, StepStatus::Pending);
    }

    #[test]
    fn a_planned_outcome_replaces_the_steps_that_follow() {
        let mut run = run_with(&["plan", "placeholder"]);
        let Next::RunStep { epoch, .. } = advance(&mut run, Input::Start, &ctx(0)).unwrap() else {
            panic!("plan not started");
        };
        let planned = StepOutcome::Planned {
            note: "planned".into(),
            steps: vec![step("one"), step("two")],
        };
        let next = advance(
            &mut run,
            Input::StepFinished {
                epoch,
                outcome: planned,
            },
            &ctx(1),
        );
        assert!(
            matches!(next, Ok(Next::RunStep { index: 1, .. })),
            "{next:?}"
        );
        let labels: Vec<String> = run.steps.iter().map(Step::label).collect();
        assert_eq!(labels, ["plan", "workers/soak@one", "workers/soak@two"]);
        assert_eq!(run.steps[0].status, StepStatus::Done);
    }

    #[test]
    fn a_replanned_outcome_replaces_only_the_rest_of_its_stage() {
        let cp = |kind: UpgradeStep| Step::new(kind);
        let mut run = run_with(&["plan"]);
        run.steps = Steps::from(vec![
            cp(UpgradeStep::ControlPlaneNext),
            cp(UpgradeStep::MoveLeader { node: "old".into() }),
            cp(UpgradeStep::ControlPlaneNext),
            step("w1"),
            step("nodes-ready"),
        ]);
        let Next::RunStep { epoch, .. } = advance(&mut run, Input::Start, &ctx(0)).unwrap() else {
            panic!("next not started");
        };
        let replanned = StepOutcome::Replanned {
            note: "upgrade cp-2".into(),
            steps: vec![
                cp(UpgradeStep::Apply {
                    node: "cp-2".into(),
                }),
                cp(UpgradeStep::ControlPlaneNext),
            ],
        };
        let next = advance(
            &mut run,
            Input::StepFinished {
                epoch,
                outcome: replanned,
            },
            &ctx(1),
        );
        assert!(
            matches!(next, Ok(Next::RunStep { index: 1, .. })),
            "{next:?}"
        );
        let labels: Vec<String> = run.steps.iter().map(Step::label).collect();
        assert_eq!(
            labels,
            [
                "control-plane/next",
                "control-plane/apply@cp-2",
                "control-plane/next",
                "workers/soak@w1",
                "preflight/nodes-ready"
            ]
        );
    }

    #[test]
    fn a_gate_after_a_step_is_started_through_the_queue() {
        let mut run = run_with(&["drain", "gate", "upgrade"]);
        let Next::RunStep { epoch, .. } = advance(&mut run, Input::Start, &ctx(0)).unwrap() else {
            panic!("not started");
        };
        let next = advance(
            &mut run,
            Input::StepFinished {
                epoch,
                outcome: done(),
            },
            &ctx(1),
        )
        .unwrap();
        let Next::WakeAt { at, epoch } = next else {
            panic!("the gate must come back through the queue: {next:?}");
        };
        assert_eq!(at, t(1));
        assert_eq!(run.status, RunStatus::Running);
        assert_eq!(run.current_step, Some(1));
        assert_eq!(run.steps[1].status, StepStatus::Pending);
        assert_eq!(run.steps[1].attempts, 0);
        let next = advance(&mut run, Input::Wake { epoch }, &ctx(1)).unwrap();
        assert!(matches!(next, Next::RunStep { index: 1, .. }), "{next:?}");
        assert_eq!(run.steps[1].attempts, 1);
        // A second wake of the same epoch (a crash redo) is stale and ignored.
        assert_eq!(
            advance(&mut run, Input::Wake { epoch }, &ctx(1)).unwrap(),
            Next::Nothing
        );
    }

    #[test]
    fn a_crash_redo_wake_reruns_the_step_in_hand() {
        let mut run = run_with(&["drain"]);
        advance(&mut run, Input::Start, &ctx(1)).unwrap();
        let epoch = run.epoch;
        let next = advance(&mut run, Input::Wake { epoch }, &ctx(2)).unwrap();
        assert_eq!(
            next,
            Next::RunStep {
                index: 0,
                epoch: epoch + 1
            }
        );
        assert_eq!(run.steps[0].attempts, 2);
    }

    #[test]
    fn controls_the_status_forbids_are_refused_and_change_nothing() {
        let cases = [
            (RunStatus::Succeeded, ControlAction::Halt),
            (RunStatus::Succeeded, ControlAction::Resume),
            (RunStatus::Aborted, ControlAction::Abort),
            (RunStatus::Failed, ControlAction::Resume),
            (RunStatus::Queued, ControlAction::Resume),
            (RunStatus::Running, ControlAction::Resume),
            (RunStatus::Halted, ControlAction::Halt),
        ];
        for (status, action) in cases {
            let mut run = run_with(&["a"]);
            run.status = status;
            let before = run.clone();
            let err = advance(&mut run, control(action), &ctx(1))
                .expect_err(&format!("{status} {action}"));
            assert_eq!(err.status, status);
            assert_eq!(run, before, "{status} {action} changed the run");
        }
    }

    #[test]
    fn halt_resume_abort_without_executor_record_history() {
        let mut run = run_with(&["preflight"]);
        let no_exec = |s| Context {
            can_execute: &none,
            ..ctx(s)
        };
        advance(&mut run, Input::Start, &no_exec(1)).unwrap();
        advance(&mut run, control(ControlAction::Halt), &no_exec(2)).unwrap();
        assert_eq!(run.status, RunStatus::Halted);
        advance(&mut run, control(ControlAction::Resume), &no_exec(3)).unwrap();
        assert_eq!(run.status, RunStatus::Queued);
        assert!(run.reason.starts_with(NO_EXECUTOR), "{}", run.reason);
        advance(&mut run, control(ControlAction::Abort), &no_exec(4)).unwrap();
        assert_eq!(run.status, RunStatus::Aborted);
        let path: Vec<_> = run.history.iter().map(|h| h.to).collect();
        assert_eq!(
            path,
            [
                RunStatus::Queued,
                RunStatus::Queued,
                RunStatus::Halted,
                RunStatus::Queued,
                RunStatus::Queued,
                RunStatus::Aborted
            ]
        );
    }

    fn blocked(retry: i64) -> StepOutcome {
        StepOutcome::Blocked {
            reasons: vec!["NodeNotReady {node=w2} (alertmanager)".into()],
            retry_at: t(retry),
        }
    }

    #[test]
    fn a_wait_at_a_closed_gate_restarts_the_halt_after_clock() {
        let mut run = run_with(&["gate", "drain"]);
        advance(&mut run, Input::Start, &ctx(0)).unwrap();
        let finished = |epoch, outcome| Input::StepFinished { epoch, outcome };
        advance(&mut run, finished(1, blocked(0)), &ctx(1)).unwrap();
        assert_eq!(run.blocked_since, Some(t(1)));
        advance(&mut run, Input::Wake { epoch: 2 }, &ctx(50)).unwrap();
        let window = StepOutcome::Wait {
            until: t(500),
            reason: "outside the maintenance windows".into(),
        };
        advance(&mut run, finished(3, window), &ctx(60)).unwrap();
        assert_eq!(run.status, RunStatus::Waiting);
        assert_eq!((run.blocked_since, run.blockers.len()), (None, 0));
        advance(&mut run, Input::Wake { epoch: 4 }, &ctx(500)).unwrap();
        advance(&mut run, finished(5, blocked(0)), &ctx(501)).unwrap();
        assert_eq!(
            run.status,
            RunStatus::Waiting,
            "closed 1s since the window opened, not 500s: not halted"
        );
        assert_eq!(run.blocked_since, Some(t(501)));
    }

    #[test]
    fn a_closed_gate_holds_then_halts_after_halt_after_and_resume_rechecks() {
        let mut run = run_with(&["gate", "drain"]);
        let step = |epoch| Input::StepFinished {
            epoch,
            outcome: blocked(0),
        };
        advance(&mut run, Input::Start, &ctx(0)).unwrap();
        assert_eq!(
            advance(&mut run, step(1), &ctx(1)).unwrap(),
            Next::WakeAt { at: t(0), epoch: 2 }
        );
        assert_eq!(run.status, RunStatus::Waiting);
        assert_eq!(run.blocked_since, Some(t(1)));
        assert_eq!(
            run.blockers,
            vec!["NodeNotReady {node=w2} (alertmanager)".to_owned()]
        );
        advance(&mut run, Input::Wake { epoch: 2 }, &ctx(50)).unwrap();
        assert_eq!(
            advance(&mut run, step(3), &ctx(60)).unwrap(),
            Next::WakeAt { at: t(0), epoch: 4 }
        );
        assert_eq!(
            run.blocked_since,
            Some(t(1)),
            "the window starts at the first closed check"
        );
        advance(&mut run, Input::Wake { epoch: 4 }, &ctx(100)).unwrap();
        assert_eq!(
            advance(&mut run, step(5), &ctx(101)).unwrap(),
            Next::Nothing
        );
        assert_eq!(run.status, RunStatus::Halted);
        assert!(
            run.reason.contains("gate closed for 100s"),
            "{}",
            run.reason
        );
        assert!(run.reason.contains("NodeNotReady"), "{}", run.reason);
        assert_eq!(
            run.steps[1].status,
            StepStatus::Pending,
            "the risky step did not run"
        );

        let next = advance(&mut run, control(ControlAction::Resume), &ctx(200)).unwrap();
        assert_eq!(
            next,
            Next::RunStep { index: 0, epoch: 7 },
            "resume re-checks the gate"
        );
        assert_eq!(run.blocked_since, None);
        let finished = Input::StepFinished {
            epoch: 7,
            outcome: done(),
        };
        assert_eq!(
            advance(&mut run, finished, &ctx(201)).unwrap(),
            Next::RunStep { index: 1, epoch: 8 }
        );
        assert!(run.blockers.is_empty());
    }

    #[test]
    fn an_open_gate_after_a_hold_is_recorded() {
        let mut run = run_with(&["gate"]);
        advance(&mut run, Input::Start, &ctx(0)).unwrap();
        advance(
            &mut run,
            Input::StepFinished {
                epoch: 1,
                outcome: blocked(10),
            },
            &ctx(1),
        )
        .unwrap();
        advance(&mut run, Input::Wake { epoch: 2 }, &ctx(9)).unwrap();
        advance(
            &mut run,
            Input::StepFinished {
                epoch: 3,
                outcome: done(),
            },
            &ctx(10),
        )
        .unwrap();
        assert_eq!(run.status, RunStatus::Succeeded);
        assert!(
            run.history
                .iter()
                .any(|h| h.reason.starts_with("gate open again after 9s")),
            "{:#?}",
            run.history
        );
        assert_eq!(run.blocked_since, None);
    }

    #[test]
    fn a_run_parks_at_the_first_step_nothing_can_execute() {
        fn only_gate(s: &Step) -> bool {
            s.kind.is_gate()
        }
        let mut run = run_with(&["gate", "nodes-ready"]);
        let ctx = |secs| Context {
            can_execute: &only_gate,
            ..ctx(secs)
        };
        assert_eq!(
            advance(&mut run, Input::Start, &ctx(0)).unwrap(),
            Next::RunStep { index: 0, epoch: 1 }
        );
        let finished = Input::StepFinished {
            epoch: 1,
            outcome: done(),
        };
        assert_eq!(advance(&mut run, finished, &ctx(1)).unwrap(), Next::Nothing);
        assert_eq!(run.status, RunStatus::Queued);
        assert_eq!(run.current_step, Some(1));
        assert_eq!(
            run.reason,
            format!("{NO_EXECUTOR} (next step: preflight/nodes-ready)")
        );
    }

    #[test]
    fn a_wake_for_a_step_nothing_can_execute_parks_the_run() {
        let mut run = run_with(&["drain"]);
        advance(&mut run, Input::Start, &ctx(0)).unwrap();
        let epoch = run.epoch;
        let ctx = Context {
            can_execute: &none,
            ..ctx(1)
        };
        assert_eq!(
            advance(&mut run, Input::Wake { epoch }, &ctx).unwrap(),
            Next::Nothing
        );
        assert_eq!(run.status, RunStatus::Queued);
        assert!(run.reason.starts_with(NO_EXECUTOR), "{}", run.reason);
        assert_eq!(run.steps[0].status, StepStatus::Pending);
    }

    /// Gate, then workers `names`' cycles (drain, upgrade, verify, uncordon), one soak,
    /// then a post-flight check.
    fn batch_run(names: &[&str]) -> Run {
        let stage = Stage::Workers;
        let mut steps = vec![Step::new(UpgradeStep::Gate {
            stage,
            node: Some(names[0].into()),
        })];
        for n in names {
            let node = || n.to_string();
            steps.push(Step::new(UpgradeStep::Drain {
                stage,
                node: node(),
            }));
            steps.push(Step::new(UpgradeStep::Upgrade {
                stage,
                node: node(),
            }));
            steps.push(Step::new(UpgradeStep::Verify {
                stage,
                node: node(),
            }));
            steps.push(Step::new(UpgradeStep::Uncordon {
                stage,
                node: node(),
            }));
        }
        steps.push(Step::new(UpgradeStep::Soak {
            stage,
            node: names[names.len() - 1].into(),
        }));
        steps.push(Step::new(UpgradeStep::NodesAtTarget));
        Run::new(
            "r1".into(),
            crate::domain::upgrade_step::K8S_UPGRADE,
            serde_json::json!({}),
            Some("1.34.5".into()),
            steps,
            t(0),
            "accepted",
        )
    }

    /// The steps to run in `next`, by label, with their epochs.
    fn started(run: &Run, next: Next) -> Vec<(String, u64)> {
        next.into_each()
            .into_iter()
            .filter_map(|n| match n {
                Next::RunStep { index, epoch } => Some((run.steps[index].label(), epoch)),
                _ => None,
            })
            .collect()
    }

    fn labels_of(started: &[(String, u64)]) -> Vec<&str> {
        started.iter().map(|(l, _)| l.as_str()).collect()
    }

    /// Finishes the step in hand labelled `label` with `outcome`.
    fn finish(run: &mut Run, label: &str, outcome: StepOutcome, ctx: &Context) -> Next {
        let epoch = run
            .steps_in_hand()
            .find(|s| s.label() == label)
            .unwrap_or_else(|| panic!("{label} is not in hand: {:?}", run.summary().in_hand))
            .epoch;
        advance(run, Input::StepFinished { epoch, outcome }, ctx).unwrap()
    }

    /// Finishes, one after another, every step in hand of the lanes `lanes` until their
    /// cycles are done.
    fn finish_cycles(run: &mut Run, lanes: &[&str], ctx: &Context) -> Next {
        let mut last = Next::Nothing;
        for stepname in ["drain", "upgrade", "verify", "uncordon"] {
            for lane in lanes {
                last = finish(run, &format!("workers/{stepname}@{lane}"), done(), ctx);
            }
        }
        last
    }

    #[test]
    fn a_batch_works_its_workers_cycles_together_and_soaks_once_after_the_last() {
        let mut run = batch_run(&["w1", "w2", "w3"]);
        let c = ctx(1);
        let gate = advance(&mut run, Input::Start, &c).unwrap();
        assert_eq!(labels_of(&started(&run, gate)), ["workers/gate@w1"]);
        let drains = finish(&mut run, "workers/gate@w1", done(), &c);
        assert_eq!(
            labels_of(&started(&run, drains)),
            ["workers/drain@w1", "workers/drain@w2", "workers/drain@w3"],
            "one gate for the batch, then every worker's drain at once"
        );
        assert_eq!(run.summary().in_hand.len(), 3);
        // Each worker goes on on its own: w2's drain ends first, its script starts alone.
        let next = finish(&mut run, "workers/drain@w2", done(), &c);
        assert_eq!(labels_of(&started(&run, next)), ["workers/upgrade@w2"]);
        assert_eq!(run.status, RunStatus::Running);
        for step in ["upgrade@w2", "verify@w2", "uncordon@w2"] {
            finish(&mut run, &format!("workers/{step}"), done(), &c);
        }
        // w2's cycle is over; the soak waits for the batch.
        assert!(!run.summary().in_hand.iter().any(|l| l.contains("soak")));
        let last = finish_cycles(&mut run, &["w1", "w3"], &c);
        assert_eq!(labels_of(&started(&run, last)), ["workers/soak@w3"]);
        let next = finish(&mut run, "workers/soak@w3", done(), &c);
        assert_eq!(
            labels_of(&started(&run, next)),
            ["postflight/nodes-at-target"]
        );
        finish(&mut run, "postflight/nodes-at-target", done(), &c);
        assert_eq!(run.status, RunStatus::Succeeded);
        assert!(run.steps.iter().all(|s| s.attempts == 1), "nothing redone");
        assert!(run.in_hand.is_empty());
    }

    #[test]
    fn a_worker_waiting_on_its_retry_holds_neither_the_others_nor_the_run_status() {
        let mut run = batch_run(&["w1", "w2"]);
        let c = ctx(1);
        advance(&mut run, Input::Start, &c).unwrap();
        finish(&mut run, "workers/gate@w1", done(), &c);
        let wake = finish(&mut run, "workers/drain@w1", StepOutcome::retry("429"), &c);
        let Next::WakeAt { epoch, .. } = wake else {
            panic!("{wake:?}")
        };
        assert_eq!(run.status, RunStatus::Running, "w2's drain still runs");
        let next = finish(&mut run, "workers/drain@w2", done(), &c);
        assert_eq!(labels_of(&started(&run, next)), ["workers/upgrade@w2"]);
        let again = advance(&mut run, Input::Wake { epoch }, &c).unwrap();
        assert_eq!(labels_of(&started(&run, again)), ["workers/drain@w1"]);
        assert_eq!(run.steps[1].attempts, 2);
        // An old wake of a step started again since is stale.
        assert_eq!(
            advance(&mut run, Input::Wake { epoch }, &c).unwrap(),
            Next::Nothing
        );
        // With w2 done and w1 waiting on its retry, the run waits.
        finish(&mut run, "workers/upgrade@w2", done(), &c);
        finish(&mut run, "workers/verify@w2", done(), &c);
        let wait = finish(&mut run, "workers/drain@w1", StepOutcome::retry("429"), &c);
        assert!(matches!(wait, Next::WakeAt { .. }), "{wait:?}");
        assert_eq!(run.status, RunStatus::Running, "w2's uncordon runs");
        finish(&mut run, "workers/uncordon@w2", done(), &c);
        assert_eq!(run.status, RunStatus::Waiting, "{}", run.reason);
        assert_eq!(run.reason, "waiting on workers/drain@w1");
    }

    #[test]
    fn within_the_failure_budget_a_failed_worker_is_left_behind_and_resume_retries_only_it() {
        let mut run = batch_run(&["w1", "w2", "w3"]);
        let c = Context {
            failure_budget: FailureBudget::Count(1),
            ..ctx(1)
        };
        advance(&mut run, Input::Start, &c).unwrap();
        finish(&mut run, "workers/gate@w1", done(), &c);
        for lane in ["w1", "w2", "w3"] {
            finish(&mut run, &format!("workers/drain@{lane}"), done(), &c);
        }
        let next = finish(
            &mut run,
            "workers/upgrade@w2",
            StepOutcome::failed("exit 1"),
            &c,
        );
        assert_eq!(next, Next::Nothing, "nothing new: w1 and w3 are in hand");
        assert_eq!(run.status, RunStatus::Running);
        assert_eq!(run.summary().left_behind, ["w2"]);
        let noted = &run.history.last().unwrap().reason;
        assert!(
            noted.contains("w2 is left behind, cordoned (1 of the failure budget's 1 used)"),
            "{noted}"
        );
        for step in ["upgrade", "verify", "uncordon"] {
            for lane in ["w1", "w3"] {
                finish(&mut run, &format!("workers/{step}@{lane}"), done(), &c);
            }
        }
        // The soak follows the others; the run holds before post-flight naming w2.
        let next = finish(&mut run, "workers/soak@w3", done(), &c);
        assert_eq!(next, Next::Nothing);
        assert_eq!(run.status, RunStatus::Halted);
        assert_eq!(
            run.reason,
            "1 worker(s) left behind, each cordoned: w2 (workers/upgrade@w2 gave up: exit 1); \
             fix them and resume to retry exactly these, or abort to leave them cordoned"
        );
        // Resume: the batch's gate again, then only w2's script onwards, then its soak.
        let gate = advance(&mut run, control(ControlAction::Resume), &c).unwrap();
        assert_eq!(labels_of(&started(&run, gate)), ["workers/gate@w1"]);
        let next = finish(&mut run, "workers/gate@w1", done(), &c);
        assert_eq!(labels_of(&started(&run, next)), ["workers/upgrade@w2"]);
        finish(&mut run, "workers/upgrade@w2", done(), &c);
        finish(&mut run, "workers/verify@w2", done(), &c);
        let soak = finish(&mut run, "workers/uncordon@w2", done(), &c);
        assert_eq!(labels_of(&started(&run, soak)), ["workers/soak@w3"]);
        finish(&mut run, "workers/soak@w3", done(), &c);
        finish(&mut run, "postflight/nodes-at-target", done(), &c);
        assert_eq!(run.status, RunStatus::Succeeded);
        let attempts = |label: &str| {
            run.steps
                .iter()
                .find(|s| s.label() == label)
                .unwrap()
                .attempts
        };
        assert_eq!(attempts("workers/drain@w2"), 1, "w2 is not drained twice");
        assert_eq!(
            attempts("workers/upgrade@w1"),
            1,
            "the others are not redone"
        );
    }

    #[test]
    fn one_failure_past_the_budget_halts_once_the_steps_in_hand_have_finished() {
        for (budget, first_left) in [
            (FailureBudget::Count(1), true),
            (FailureBudget::None, false),
        ] {
            let mut run = batch_run(&["w1", "w2", "w3"]);
            let c = Context {
                failure_budget: budget,
                ..ctx(1)
            };
            advance(&mut run, Input::Start, &c).unwrap();
            finish(&mut run, "workers/gate@w1", done(), &c);
            finish(
                &mut run,
                "workers/drain@w1",
                StepOutcome::failed("pods would not leave"),
                &c,
            );
            if first_left {
                assert_eq!(run.status, RunStatus::Running);
                let next = finish(
                    &mut run,
                    "workers/drain@w2",
                    StepOutcome::failed("exit 2"),
                    &c,
                );
                assert_eq!(next, Next::Nothing);
            }
            assert_eq!(run.status, RunStatus::Running, "w3's drain finishes first");
            let next = finish(&mut run, "workers/drain@w3", done(), &c);
            assert_eq!(next, Next::Nothing, "no new step once halting");
            if first_left {
                // w2's drain had finished: with w3's, nothing runs any more.
                assert_eq!(run.status, RunStatus::Halted);
                assert!(run.reason.contains("workers/drain@w2 gave up after 1 attempt(s): exit 2; failure budget (1 worker(s)) used up"), "{}", run.reason);
            } else {
                // w2's drain still runs.
                assert_eq!(run.status, RunStatus::Running);
                finish(&mut run, "workers/drain@w2", done(), &c);
                assert_eq!(run.status, RunStatus::Halted);
                assert!(
                    run.reason.starts_with("step workers/drain@w1 gave up"),
                    "{}",
                    run.reason
                );
            }
            // Resume asks the batch's gate again, then retries the failed drains (with
            // fresh attempts) beside the others' next steps; done steps are not redone.
            let gate = advance(&mut run, control(ControlAction::Resume), &c).unwrap();
            assert_eq!(labels_of(&started(&run, gate)), ["workers/gate@w1"]);
            let next = finish(&mut run, "workers/gate@w1", done(), &c);
            let mut again = labels_of(&started(&run, next))
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>();
            again.sort();
            let mut want = vec![
                "workers/drain@w1".to_owned(),
                "workers/upgrade@w3".to_owned(),
            ];
            want.push(
                if first_left {
                    "workers/drain@w2"
                } else {
                    "workers/upgrade@w2"
                }
                .to_owned(),
            );
            want.sort();
            assert_eq!(again, want);
        }
    }

    #[test]
    fn a_halt_finishes_the_steps_in_hand_and_starts_none() {
        let mut run = batch_run(&["w1", "w2", "w3"]);
        let c = ctx(1);
        advance(&mut run, Input::Start, &c).unwrap();
        finish(&mut run, "workers/gate@w1", done(), &c);
        advance(&mut run, control(ControlAction::Halt), &c).unwrap();
        assert!(
            run.history
                .last()
                .unwrap()
                .reason
                .ends_with("(after the 3 steps in hand)")
        );
        assert_eq!(
            finish(&mut run, "workers/drain@w1", done(), &c),
            Next::Nothing
        );
        assert_eq!(
            finish(&mut run, "workers/drain@w2", done(), &c),
            Next::Nothing
        );
        assert_eq!(run.status, RunStatus::Running);
        finish(&mut run, "workers/drain@w3", done(), &c);
        assert_eq!(run.status, RunStatus::Halted);
        assert_eq!(run.reason, "halted by operator after step workers/drain@w3");
        let next = advance(&mut run, control(ControlAction::Resume), &c).unwrap();
        assert_eq!(
            labels_of(&started(&run, next)),
            [
                "workers/upgrade@w1",
                "workers/upgrade@w2",
                "workers/upgrade@w3"
            ]
        );
    }

    #[test]
    fn an_abort_with_workers_in_hand_names_them() {
        let mut run = batch_run(&["w1", "w2"]);
        let c = ctx(1);
        advance(&mut run, Input::Start, &c).unwrap();
        finish(&mut run, "workers/gate@w1", done(), &c);
        advance(&mut run, control(ControlAction::Abort), &c).unwrap();
        assert_eq!(run.status, RunStatus::Aborted);
        assert!(
            run.reason.ends_with("possibly cordoned: w1, w2"),
            "{}",
            run.reason
        );
        assert_eq!(
            finish_late(&mut run, "workers/drain@w1"),
            Next::Nothing,
            "a late outcome changes nothing"
        );
    }

    /// Feeds a late outcome for `label` (no longer in hand) with the epoch it had.
    fn finish_late(run: &mut Run, label: &str) -> Next {
        let epoch = run.steps.iter().find(|s| s.label() == label).unwrap().epoch;
        advance(
            run,
            Input::StepFinished {
                epoch,
                outcome: done(),
            },
            &ctx(2),
        )
        .unwrap()
    }

    #[test]
    fn after_a_crash_every_step_in_hand_is_redone_under_a_new_epoch() {
        let mut run = batch_run(&["w1", "w2", "w3"]);
        let c = ctx(1);
        advance(&mut run, Input::Start, &c).unwrap();
        finish(&mut run, "workers/gate@w1", done(), &c);
        finish(&mut run, "workers/drain@w2", done(), &c);
        // Stored, read back after kill -9: what was running is redone, each once.
        crate::domain::step_kind::register(&[crate::domain::upgrade_step::STEPS]);
        let mut run: Run = serde_json::from_value(serde_json::to_value(&run).unwrap()).unwrap();
        let redo = run.running_in_hand();
        assert_eq!(redo.len(), 3);
        let mut again = Vec::new();
        for (_, epoch) in &redo {
            again.extend(started(
                &run.clone(),
                advance(&mut run, Input::Wake { epoch: *epoch }, &c).unwrap(),
            ));
        }
        let mut labels = labels_of(&again);
        labels.sort();
        assert_eq!(
            labels,
            ["workers/drain@w1", "workers/drain@w3", "workers/upgrade@w2"]
        );
        // The old epochs' outcomes are stale.
        for (index, epoch) in redo {
            let stale = Input::StepFinished {
                epoch,
                outcome: done(),
            };
            assert_eq!(advance(&mut run, stale, &c).unwrap(), Next::Nothing);
            assert_ne!(run.steps[index].status, StepStatus::Done);
        }
    }

    #[test]
    fn a_run_stored_with_one_step_in_hand_carries_on() {
        let mut run = run_with(&["a", "b"]);
        advance(&mut run, Input::Start, &ctx(1)).unwrap();
        // As stored before steps had epochs: no in_hand, no step epoch.
        run.in_hand.clear();
        run.steps[0].epoch = 0;
        let stored = serde_json::to_value(&run).unwrap();
        assert!(stored.get("in_hand").is_none() && stored["steps"][0].get("epoch").is_none());
        crate::domain::step_kind::register(&[crate::domain::upgrade_step::STEPS]);
        let mut run: Run = serde_json::from_value(stored).unwrap();
        let epoch = run.epoch;
        let next = advance(
            &mut run,
            Input::StepFinished {
                epoch,
                outcome: done(),
            },
            &ctx(2),
        )
        .unwrap();
        assert!(matches!(next, Next::RunStep { index: 1, .. }), "{next:?}");
    }

    #[test]
    fn control_planes_have_no_failure_budget() {
        let node = || "cp".to_owned();
        let mut run = run_with(&[]);
        run.steps = Steps::from(vec![
            Step::new(UpgradeStep::Upgrade {
                stage: Stage::ControlPlane,
                node: node(),
            }),
            Step::new(UpgradeStep::Verify {
                stage: Stage::ControlPlane,
                node: node(),
            }),
        ]);
        let c = Context {
            failure_budget: FailureBudget::Count(5),
            ..ctx(1)
        };
        let Next::RunStep { epoch, .. } = advance(&mut run, Input::Start, &c).unwrap() else {
            panic!("not started")
        };
        let failed = Input::StepFinished {
            epoch,
            outcome: StepOutcome::failed("kubeadm exited with 1"),
        };
        assert_eq!(advance(&mut run, failed, &c).unwrap(), Next::Nothing);
        assert_eq!(run.status, RunStatus::Halted);
        assert!(
            run.left_behind.is_empty(),
            "a control plane is never left behind"
        );
        assert!(
            run.reason.contains("control-plane/upgrade@cp gave up"),
            "{}",
            run.reason
        );
    }
}
