//! A run's plan, its steps shared between the copies of the run: the worker executes each
//! step with the run as it was when the step started, while the run in hand moves on. A
//! copy of a plan of thousands of steps costs one pointer per step, and changing a step
//! copies that step alone.

use std::ops::{Index, IndexMut, RangeBounds};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::run::Step;

/// A run's steps, in plan order: indexed and iterated as a list of [`Step`]s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Steps(Vec<Arc<Step>>);

impl Steps {
    /// How many steps.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Step `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&Step> {
        self.0.get(index).map(|s| &**s)
    }

    /// Step `index` to change, if there is one: this copy's own from then on.
    pub fn get_mut(&mut self, index: usize) -> Option<&mut Step> {
        self.0.get_mut(index).map(Arc::make_mut)
    }

    /// The steps in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Step> + ExactSizeIterator + Clone {
        self.0.iter().map(|s| &**s)
    }

    /// The steps from `start` to `end` (both clamped to the plan), in order.
    pub fn range(
        &self,
        start: usize,
        end: usize,
    ) -> impl DoubleEndedIterator<Item = &Step> + ExactSizeIterator + Clone {
        let end = end.min(self.0.len());
        self.0[start.min(end)..end].iter().map(|s| &**s)
    }

    /// The last step.
    pub fn last(&self) -> Option<&Step> {
        self.0.last().map(|s| &**s)
    }

    /// Adds `step` at the end.
    pub fn push(&mut self, step: Step) {
        self.0.push(Arc::new(step));
    }

    /// Keeps the first `len` steps.
    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }

    /// Forgets every step.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Replaces the steps in `range` with `steps`.
    pub fn splice(
        &mut self,
        range: impl RangeBounds<usize>,
        steps: impl IntoIterator<Item = Step>,
    ) {
        self.0.splice(range, steps.into_iter().map(Arc::new));
    }
}

impl Index<usize> for Steps {
    type Output = Step;

    fn index(&self, index: usize) -> &Step {
        &self.0[index]
    }
}

impl IndexMut<usize> for Steps {
    /// Step `index` to change: this copy's own from then on, the others keep theirs.
    fn index_mut(&mut self, index: usize) -> &mut Step {
        Arc::make_mut(&mut self.0[index])
    }
}

impl Extend<Step> for Steps {
    fn extend<I: IntoIterator<Item = Step>>(&mut self, steps: I) {
        self.0.extend(steps.into_iter().map(Arc::new));
    }
}

impl FromIterator<Step> for Steps {
    fn from_iter<I: IntoIterator<Item = Step>>(steps: I) -> Self {
        Self(steps.into_iter().map(Arc::new).collect())
    }
}

impl From<Vec<Step>> for Steps {
    fn from(steps: Vec<Step>) -> Self {
        steps.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Steps {
    type Item = &'a Step;
    type IntoIter = std::iter::Map<std::slice::Iter<'a, Arc<Step>>, fn(&Arc<Step>) -> &Step>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|s| &**s)
    }
}

impl Serialize for Steps {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Steps {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Step>::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::StepStatus;
    use crate::domain::upgrade_step::{Stage, UpgradeStep};

    fn plan(n: usize) -> Steps {
        (0..n)
            .map(|i| {
                Step::new(UpgradeStep::Drain {
                    stage: Stage::Workers,
                    node: format!("w{i}"),
                })
            })
            .collect()
    }

    #[test]
    fn a_copy_shares_the_steps_until_one_changes() {
        let mut run = plan(3);
        let snapshot = run.clone();
        run[1].status = StepStatus::Running;
        assert_eq!(
            snapshot[1].status,
            StepStatus::Pending,
            "the copy keeps its own"
        );
        assert_eq!(run[1].status, StepStatus::Running);
        assert!(
            Arc::ptr_eq(&run.0[0], &snapshot.0[0]),
            "unchanged steps are shared"
        );
        assert!(!Arc::ptr_eq(&run.0[1], &snapshot.0[1]));
    }

    #[test]
    fn it_is_on_the_wire_as_a_list_of_steps() {
        let steps = plan(2);
        let json = serde_json::to_value(&steps).expect("serialises");
        let plain = serde_json::to_value(steps.iter().collect::<Vec<_>>()).expect("serialises");
        assert_eq!(json, plain);
        let back: Steps = serde_json::from_value(json).expect("reads back");
        assert_eq!(back, steps);
    }

    #[test]
    fn splice_and_range_keep_plan_order() {
        let mut steps = plan(4);
        steps.splice(
            1..3,
            [Step::new(UpgradeStep::Drain {
                stage: Stage::Workers,
                node: "x".into(),
            })],
        );
        let nodes: Vec<_> = steps.iter().filter_map(|s| s.kind.node()).collect();
        assert_eq!(nodes, ["w0", "x", "w3"]);
        let tail: Vec<_> = steps.range(1, 9).filter_map(|s| s.kind.node()).collect();
        assert_eq!(tail, ["x", "w3"]);
        assert_eq!(steps.range(5, 9).count(), 0);
    }
}
