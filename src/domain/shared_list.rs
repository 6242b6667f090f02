//! A list whose items are shared between its copies: a run's plan is one. The worker
//! executes each step with the run as it was when the step started, while the run in hand
//! moves on; a copy of a plan of thousands of steps costs one pointer per step, and
//! changing an item copies that item alone.

use std::ops::{Bound, Index, IndexMut, RangeBounds};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A list of `T`, in order, each item shared with the list's copies until one of them
/// changes it.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedList<T>(Vec<Arc<T>>);

impl<T> Default for SharedList<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> SharedList<T> {
    /// How many items.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Item `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&T> {
        self.0.get(index).map(|s| &**s)
    }

    /// The items in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator + Clone {
        self.0.iter().map(|s| &**s)
    }

    /// The items in `range`, its ends clamped to the list, in order.
    pub fn range(
        &self,
        range: impl RangeBounds<usize>,
    ) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator + Clone {
        let len = self.0.len();
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => len,
        }
        .min(len);
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        }
        .min(end);
        self.0[start..end].iter().map(|s| &**s)
    }

    /// Adds `item` at the end.
    pub fn push(&mut self, item: T) {
        self.0.push(Arc::new(item));
    }

    /// Keeps the first `len` items.
    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }

    /// Forgets every item.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Replaces the items in `range` with `items`.
    pub fn splice(&mut self, range: impl RangeBounds<usize>, items: impl IntoIterator<Item = T>) {
        self.0.splice(range, items.into_iter().map(Arc::new));
    }
}

impl<T> Index<usize> for SharedList<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        &self.0[index]
    }
}

impl<T: Clone> IndexMut<usize> for SharedList<T> {
    /// Item `index` to change: this copy's own from then on, the others keep theirs.
    fn index_mut(&mut self, index: usize) -> &mut T {
        Arc::make_mut(&mut self.0[index])
    }
}

impl<T> Extend<T> for SharedList<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, items: I) {
        self.0.extend(items.into_iter().map(Arc::new));
    }
}

impl<T> FromIterator<T> for SharedList<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        Self(items.into_iter().map(Arc::new).collect())
    }
}

impl<T> From<Vec<T>> for SharedList<T> {
    fn from(items: Vec<T>) -> Self {
        items.into_iter().collect()
    }
}

impl<'a, T> IntoIterator for &'a SharedList<T> {
    type Item = &'a T;
    type IntoIter = std::iter::Map<std::slice::Iter<'a, Arc<T>>, fn(&Arc<T>) -> &T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|s| &**s)
    }
}

impl<T: Serialize> Serialize for SharedList<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for SharedList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<T>::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a step: a node and what happened to it.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Item {
        node: String,
        done: bool,
    }

    fn plan(n: usize) -> SharedList<Item> {
        (0..n)
            .map(|i| Item {
                node: format!("w{i}"),
                done: false,
            })
            .collect()
    }

    fn nodes<'a>(items: impl Iterator<Item = &'a Item>) -> Vec<&'a str> {
        items.map(|i| i.node.as_str()).collect()
    }

    #[test]
    fn a_copy_shares_the_items_until_one_changes() {
        let mut run = plan(3);
        let snapshot = run.clone();
        run[1].done = true;
        assert!(!snapshot[1].done, "the copy keeps its own");
        assert!(run[1].done);
        assert!(
            Arc::ptr_eq(&run.0[0], &snapshot.0[0]),
            "unchanged items are shared"
        );
        assert!(!Arc::ptr_eq(&run.0[1], &snapshot.0[1]));
    }

    #[test]
    fn it_is_on_the_wire_as_a_plain_list() {
        let items = plan(2);
        let json = serde_json::to_value(&items).expect("serialises");
        let plain = serde_json::to_value(items.iter().collect::<Vec<_>>()).expect("serialises");
        assert_eq!(json, plain);
        let back: SharedList<Item> = serde_json::from_value(json).expect("reads back");
        assert_eq!(back, items);
    }

    #[test]
    fn splice_and_range_keep_order_and_clamp() {
        let mut items = plan(4);
        items.splice(
            1..3,
            [Item {
                node: "x".into(),
                done: false,
            }],
        );
        assert_eq!(nodes(items.iter()), ["w0", "x", "w3"]);
        let cases: [(std::ops::Range<usize>, &[&str]); 4] = [
            (1..9, &["x", "w3"]),
            (5..9, &[]),
            (std::ops::Range { start: 2, end: 1 }, &[]),
            (0..2, &["w0", "x"]),
        ];
        for (range, want) in cases {
            assert_eq!(nodes(items.range(range.clone())), want, "{range:?}");
        }
        assert_eq!(nodes(items.range(1..)), ["x", "w3"]);
        assert_eq!(nodes(items.range(..=0)), ["w0"]);
        assert_eq!(nodes(items.range(..).rev()), ["w3", "x", "w0"]);
    }
}
