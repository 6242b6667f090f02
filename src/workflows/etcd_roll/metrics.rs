//! The etcd roll's own metric families, which the control-plane stage of an upgrade also
//! counts into (target `control-planes`).

use prometheus::{GaugeVec, IntCounterVec, Opts};

use crate::metrics::{Families, MetricSet, MetricSetType};

/// Counters of finished etcd rolls, by roll target (`namespace/statefulset`).
pub struct EtcdRollMetrics {
    /// Rolls finished.
    pub rolls: IntCounterVec,
    /// Members restarted.
    pub restarts: IntCounterVec,
    /// Leadership changes observed (the raft term's rise).
    pub leadership_changes: IntCounterVec,
    /// Leadership transfers rollgate made.
    pub transfers: IntCounterVec,
    /// Leadership changes rollgate did not make (elections).
    pub uncontrolled_changes: IntCounterVec,
    /// The longest time without an agreed leader in the last roll.
    pub longest_leaderless: GaugeVec,
}

/// The set's type, for the workflows' registry.
pub const METRICS: MetricSetType = MetricSetType::of::<EtcdRollMetrics>();

impl MetricSet for EtcdRollMetrics {
    fn new(families: &Families) -> Self {
        let counter = |name: &str, help: &str| {
            families
                .add(IntCounterVec::new(Opts::new(name, help), &["target"]).expect("valid metric"))
        };
        Self {
            rolls: counter(
                "etcd_roll_completed_total",
                "etcd rolls finished, by target.",
            ),
            restarts: counter(
                "etcd_roll_member_restarts_total",
                "etcd members restarted by finished rolls, by target.",
            ),
            leadership_changes: counter(
                "etcd_roll_leadership_changes_total",
                "Leadership changes observed during finished etcd rolls (raft term rise).",
            ),
            transfers: counter(
                "etcd_roll_leadership_transfers_total",
                "Leadership transfers rollgate made during finished etcd rolls.",
            ),
            uncontrolled_changes: counter(
                "etcd_roll_uncontrolled_leadership_changes_total",
                "Leadership changes rollgate did not make (elections) during finished etcd rolls.",
            ),
            longest_leaderless: families.add(
                GaugeVec::new(
                    Opts::new(
                        "etcd_roll_longest_leaderless_seconds",
                        "Longest time without an agreed leader during the last finished roll.",
                    ),
                    &["target"],
                )
                .expect("valid metric"),
            ),
        }
    }
}
