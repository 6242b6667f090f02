//! The node cycle: how every workflow that takes nodes out of service plans it. Workers
//! go in batches: the batch's fetches side by side, one gate, each worker's cycle (its
//! other parts in order), the batch's cycles side by side, one soak after it. The workflow names the parts' steps;
//! what differs between workflows is the action in the middle (the node script, a reboot).

use crate::domain::run::{Step, StepStatus, Steps};

/// A part of one worker's cycle, in the order the workflow lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// A check at the node's turn that may skip the rest of its cycle (a reboot whose
    /// sentinel has cleared).
    Check,
    /// Preparation that disturbs nothing: the release downloaded and verified on the
    /// node. Every node of a batch fetches before the batch's gate, so that one bad
    /// download is refused before any node of the batch is drained, and the batch's
    /// drains still begin together.
    Fetch,
    /// Cordon and drain.
    Drain,
    /// The workflow's action: the node script, a reboot.
    Action,
    /// A reboot after the action, when the action left the node needing one (an
    /// upgrade's `reboot.after_upgrade = "if-required"`), inside the same drain.
    RebootIfRequired,
    /// The node is back as the action should leave it.
    Verify,
    /// Give the node back to the scheduler.
    Uncordon,
}

/// How a workflow names the steps of its node cycle.
pub trait CycleSteps {
    /// The workflow's step type.
    type Step;
    /// The parts of one worker's cycle, in order.
    const PARTS: &'static [Part];
    /// The gate before a batch whose first node is `node`.
    fn gate(node: &str) -> Self::Step;
    /// `part` of `node`'s cycle.
    fn part(part: Part, node: &str) -> Self::Step;
    /// The soak after a batch whose last node is `node`.
    fn soak(node: &str) -> Self::Step;
    /// The analysis after the soak of a batch whose last node is `node`.
    fn analysis(node: &str) -> Self::Step;
}

/// The steps of one batch of workers: every worker's fetch, side by side; one gate; then
/// each worker's cycle, the batch's cycles going on together so that its workers are out
/// of service together and none longer than its own cycle; one soak after the batch and,
/// when the batches are `judged` (`gate.analysis`), one analysis after the soak.
pub fn worker_batch<C: CycleSteps>(batch: &[String], judged: bool) -> Vec<C::Step> {
    let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
        return Vec::new();
    };
    let fetch = |part: &&Part| **part == Part::Fetch;
    let mut steps: Vec<C::Step> = batch
        .iter()
        .flat_map(|node| C::PARTS.iter().filter(fetch).map(|&p| C::part(p, node)))
        .collect();
    steps.push(C::gate(first));
    for node in batch {
        steps.extend(
            C::PARTS
                .iter()
                .filter(|p| !fetch(p))
                .map(|&part| C::part(part, node)),
        );
    }
    steps.push(C::soak(last));
    if judged {
        steps.push(C::analysis(last));
    }
    steps
}

/// Every batch of `nodes`, `size` at a time, in order (each `judged` or not).
pub fn worker_batches<C: CycleSteps>(nodes: &[String], size: usize, judged: bool) -> Vec<C::Step> {
    nodes
        .chunks(size.max(1))
        .flat_map(|batch| worker_batch::<C>(batch, judged))
        .collect()
}

/// The nodes of the batch of step `index` (a drain) whose drains have not finished,
/// besides its own: they are checked for holds before any of the batch is cordoned (a
/// node already cordoned has nothing to check), so that a batch is not begun that
/// cannot be finished.
pub fn drains_ahead(steps: &Steps, index: usize) -> Vec<&str> {
    let in_batch = |s: &&Step| s.kind.lane().is_some();
    let before = steps.range(..index).rev().take_while(in_batch);
    let after = steps.iter().skip(index + 1).take_while(in_batch);
    before
        .chain(after)
        .filter(|s| s.status != StepStatus::Done && s.kind.is_drain())
        .filter_map(|s| s.kind.node())
        .collect()
}

/// The nodes `steps` have in hand: drained (or being drained) and not yet uncordoned, in
/// the order of their drains.
pub fn nodes_in_hand(steps: &Steps) -> Vec<&str> {
    let uncordoned: std::collections::HashSet<&str> = steps
        .iter()
        .filter(|s| s.status == StepStatus::Done && s.kind.is_uncordon())
        .filter_map(|s| s.kind.node())
        .collect();
    steps
        .iter()
        .filter(|s| s.status != StepStatus::Pending && s.kind.is_drain())
        .filter_map(|s| s.kind.node())
        .filter(|node| !uncordoned.contains(node))
        .collect()
}
