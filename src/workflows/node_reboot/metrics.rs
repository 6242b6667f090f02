//! The reboot workflow's own metric families.

use prometheus::{GaugeVec, IntGaugeVec, Opts};

use crate::metrics::{Families, MetricSet, MetricSetType};

/// Per node: whether its sentinel is set, and when rollgate last sent it the reboot and
/// saw it back.
pub struct RebootMetrics {
    /// Per node, 1 when its reboot sentinel was set when rollgate last read it, 0 when
    /// not (or once rollgate rebooted it); kured's `kured_reboot_required`.
    pub required: IntGaugeVec,
    /// Per node, when rollgate last sent it the reboot command (Unix seconds).
    pub sent: GaugeVec,
    /// Per node, when rollgate last saw it back from its reboot (Unix seconds): a boot
    /// between the two is rollgate's own (rules: `NodeRecentlyRebooted`).
    pub back: GaugeVec,
}

/// The set's type, for the workflows' registry.
pub const METRICS: MetricSetType = MetricSetType::of::<RebootMetrics>();

impl MetricSet for RebootMetrics {
    fn new(families: &Families) -> Self {
        let per_node = |name: &str, help: &str| {
            families.add(GaugeVec::new(Opts::new(name, help), &["node"]).expect("valid metric"))
        };
        Self {
            required: families.add(
                IntGaugeVec::new(
                    Opts::new(
                        "rollgate_node_reboot_required",
                        "1 when the node's reboot sentinel was set when rollgate last read it, else 0.",
                    ),
                    &["node"],
                )
                .expect("valid metric"),
            ),
            sent: per_node(
                "rollgate_node_reboot_sent_timestamp_seconds",
                "When rollgate last sent the node its reboot command (Unix time).",
            ),
            back: per_node(
                "rollgate_node_reboot_back_timestamp_seconds",
                "When rollgate last saw the node back from its reboot (Unix time).",
            ),
        }
    }
}
