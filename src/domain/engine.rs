//! The run state machine: `(run, input) -> (run', next)`, a pure function.
//!
//! The worker feeds it inputs (a start, a step's outcome, a wake, an operator's control)
//! and carries out what it returns (run a step, schedule a wake). It never does IO.

use chrono::{DateTime, Utc};

use super::backoff::Backoff;
use super::event::ControlAction;
use super::run::{Learned, Run, RunStatus, Step, StepStatus};

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
    match input {
        Input::Start => Ok(match run.status {
            RunStatus::Queued => start(run, ctx),
            _ => Next::Nothing,
        }),
        Input::Control { action, reason, by } => {
            check_control(run, action)?;
            let since = run.history.len();
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

fn start(run: &mut Run, ctx: &Context) -> Next {
    let next = run
        .current_step
        .filter(|&i| {
            run.steps
                .get(i)
                .is_some_and(|s| s.status != StepStatus::Done)
        })
        .or_else(|| run.steps.iter().position(|s| s.status != StepStatus::Done));
    match next {
        Some(index) if !(ctx.can_execute)(&run.steps[index]) => {
            run.current_step = Some(index);
            let reason = format!("{NO_EXECUTOR} (next step: {})", run.steps[index].label());
            run.transition(RunStatus::Queued, reason, ctx.now);
            Next::Nothing
        }
        Some(index) => run_step(run, index, ctx),
        None => {
            run.current_step = None;
            run.transition(RunStatus::Succeeded, "every step done", ctx.now);
            Next::Nothing
        }
    }
}

fn run_step(run: &mut Run, index: usize, ctx: &Context) -> Next {
    run.current_step = Some(index);
    run.wake_at = None;
    run.epoch += 1;
    let step = &mut run.steps[index];
    step.status = StepStatus::Running;
    step.attempts += 1;
    step.started_at.get_or_insert(ctx.now);
    let reason = format!("step {} (attempt {})", step.label(), step.attempts);
    run.transition(RunStatus::Running, reason, ctx.now);
    Next::RunStep {
        index,
        epoch: run.epoch,
    }
}

fn schedule_wake(run: &mut Run, at: DateTime<Utc>, reason: String, ctx: &Context) -> Next {
    run.epoch += 1;
    run.wake_at = Some(at);
    run.transition(RunStatus::Waiting, reason, ctx.now);
    Next::WakeAt {
        at,
        epoch: run.epoch,
    }
}

fn hold(run: &mut Run, reason: String, ctx: &Context) {
    run.epoch += 1;
    run.wake_at = None;
    run.halt_requested = false;
    run.halt_requested_by = None;
    run.transition(RunStatus::Halted, reason, ctx.now);
}

/// Applies a halt asked for while a step ran (`halted by <who> <detail>`), crediting
/// whoever asked.
fn hold_as_requested(run: &mut Run, detail: String, ctx: &Context) {
    let by = run.halt_requested_by.take();
    let since = run.history.len();
    let who = by.as_deref().unwrap_or("operator");
    hold(run, format!("halted by {who} {detail}"), ctx);
    if let Some(by) = &by {
        run.credit(since, by);
    }
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
            // The step in hand finishes first; its outcome applies the halt.
            run.halt_requested = true;
            run.halt_requested_by = by.map(str::to_owned);
            run.note(format!("{reason} (after the step in hand)"), ctx.now);
            Next::Nothing
        }
        ControlAction::Halt => {
            hold(run, reason, ctx);
            Next::Nothing
        }
        ControlAction::Resume => {
            // A fresh halt_after window: the operator has looked at the blockers.
            run.blocked_since = None;
            if let Some(step) = run.current_step.and_then(|i| run.steps.get_mut(i))
                && step.status != StepStatus::Done
            {
                // A fresh set of attempts: the operator fixed what made it give up.
                step.attempts = 0;
                step.status = StepStatus::Pending;
                // And a fresh clock for the steps that wait with a bound (verify, health).
                step.started_at = None;
            }
            run.transition(RunStatus::Queued, reason, ctx.now);
            start(run, ctx)
        }
        ControlAction::Abort => {
            run.epoch += 1;
            run.wake_at = None;
            run.halt_requested = false;
            run.halt_requested_by = None;
            run.transition(RunStatus::Aborted, reason, ctx.now);
            Next::Nothing
        }
    }
}

fn wake(run: &mut Run, epoch: u64, ctx: &Context) -> Next {
    if epoch != run.epoch {
        return Next::Nothing;
    }
    match (run.status, run.current_step) {
        (RunStatus::Waiting | RunStatus::Running, Some(index)) => {
            if run.halt_requested {
                hold_as_requested(run, "after the step in hand".into(), ctx);
                return Next::Nothing;
            }
            if !(ctx.can_execute)(&run.steps[index]) {
                // E.g. restarted with a configuration that no longer executes this step.
                run.epoch += 1;
                run.wake_at = None;
                run.steps[index].status = StepStatus::Pending;
                let reason = format!("{NO_EXECUTOR} (next step: {})", run.steps[index].label());
                run.transition(RunStatus::Queued, reason, ctx.now);
                return Next::Nothing;
            }
            run_step(run, index, ctx)
        }
        _ => Next::Nothing,
    }
}

fn step_done(run: &mut Run, index: usize, note: String, ctx: &Context) -> Next {
    let step = &mut run.steps[index];
    let label = step.label();
    step.status = StepStatus::Done;
    step.ended_at = Some(ctx.now);
    step.outcome = Some(note);
    run.blockers.clear();
    if let Some(since) = run.blocked_since.take() {
        let held = (ctx.now - since).num_seconds();
        run.note(
            format!("gate open again after {held}s: step {label} done"),
            ctx.now,
        );
    }
    if run.halt_requested {
        hold_as_requested(run, format!("after step {label}"), ctx);
        return Next::Nothing;
    }
    let next = run.steps.iter().position(|s| s.status != StepStatus::Done);
    if let Some(next) = next
        && run.steps[next].kind.is_gate()
        && (ctx.can_execute)(&run.steps[next])
    {
        // A gate is asked only from the queue: alerts that arrived while earlier steps
        // ran are on the board by then, so a gate never reads a board that is behind.
        run.current_step = Some(next);
        run.epoch += 1;
        run.wake_at = Some(ctx.now);
        return Next::WakeAt {
            at: ctx.now,
            epoch: run.epoch,
        };
    }
    start(run, ctx)
}

fn step_finished(run: &mut Run, epoch: u64, outcome: StepOutcome, ctx: &Context) -> Next {
    if epoch != run.epoch || run.status != RunStatus::Running {
        return Next::Nothing;
    }
    let Some(index) = run.current_step else {
        return Next::Nothing;
    };
    let max_attempts = ctx.max_attempts.max(1);
    let step = &mut run.steps[index];
    let label = step.label();
    match outcome {
        StepOutcome::Done { note, learned } => {
            if let Some(learned) = learned {
                run.memory.keep(learned);
            }
            step_done(run, index, note, ctx)
        }
        StepOutcome::Planned { note, steps } => {
            run.steps.truncate(index + 1);
            run.steps.extend(steps);
            step_done(run, index, note, ctx)
        }
        StepOutcome::Replanned { note, steps } => {
            let stage = run.steps[index].kind.stage_name();
            let end = run.steps[index + 1..]
                .iter()
                .position(|s| s.kind.stage_name() != stage)
                .map_or(run.steps.len(), |p| index + 1 + p);
            run.steps.splice(index + 1..end, steps);
            step_done(run, index, note, ctx)
        }
        StepOutcome::Wait { until, reason } => {
            step.status = StepStatus::Waiting;
            step.outcome = Some(reason.clone());
            // A wait is not a closed gate (a maintenance window closed): the clock of
            // halt_after starts again when the gate is next asked.
            run.blockers.clear();
            run.blocked_since = None;
            if run.halt_requested {
                hold_as_requested(run, format!("at step {label}: {reason}"), ctx);
                return Next::Nothing;
            }
            schedule_wake(run, until, format!("step {label}: {reason}"), ctx)
        }
        StepOutcome::Retry { error } if step.attempts < max_attempts => {
            step.status = StepStatus::Waiting;
            step.outcome = Some(error.clone());
            let attempts = step.attempts;
            if run.halt_requested {
                hold_as_requested(run, format!("at step {label}: {error}"), ctx);
                return Next::Nothing;
            }
            let reason = format!(
                "step {label} failed (attempt {attempts} of {max_attempts}), retrying: {error}"
            );
            let pause = ctx.retry.pause(attempts, ctx.jitter);
            let at = ctx.now + chrono::Duration::from_std(pause).unwrap_or(chrono::Duration::MAX);
            schedule_wake(run, at, reason, ctx)
        }
        StepOutcome::Blocked { reasons, retry_at } => {
            step.status = StepStatus::Waiting;
            let summary = reasons.join("; ");
            step.outcome = Some(format!("gate closed: {summary}"));
            let since = *run.blocked_since.get_or_insert(ctx.now);
            run.blockers = reasons;
            let held = ctx.now - since;
            if held >= ctx.halt_after {
                let reason = format!(
                    "gate closed for {}s at step {label} (halt_after {}s): {summary}",
                    held.num_seconds(),
                    ctx.halt_after.num_seconds()
                );
                hold(run, reason, ctx);
                return Next::Nothing;
            }
            if run.halt_requested {
                hold_as_requested(run, format!("at step {label}: gate closed: {summary}"), ctx);
                return Next::Nothing;
            }
            schedule_wake(
                run,
                retry_at,
                format!("gate closed at step {label}: {summary}"),
                ctx,
            )
        }
        StepOutcome::Retry { error, .. } | StepOutcome::Failed { error } => {
            step.status = StepStatus::Failed;
            step.ended_at = Some(ctx.now);
            step.outcome = Some(error.clone());
            let reason = format!(
                "step {label} gave up after {} attempt(s): {error}",
                step.attempts
            );
            match run.on_failure {
                super::run::FailurePolicy::Halt => hold(run, reason, ctx),
                super::run::FailurePolicy::Fail => {
                    run.epoch += 1;
                    run.transition(RunStatus::Failed, reason, ctx.now);
                }
            }
            Next::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Stage;
    use crate::domain::run::{FailurePolicy, RunKind};
    use crate::domain::step::UpgradeStep;
    use chrono::TimeZone;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).single().unwrap()
    }

    fn run_with(steps: &[&str]) -> Run {
        Run::new(
            "r1".into(),
            RunKind::K8sUpgrade,
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
        run.steps = vec![
            cp(UpgradeStep::ControlPlaneNext),
            cp(UpgradeStep::MoveLeader { node: "old".into() }),
            cp(UpgradeStep::ControlPlaneNext),
            step("w1"),
            step("nodes-ready"),
        ];
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
}
