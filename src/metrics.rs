//! Prometheus metrics, exposed at `/metrics`.

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The registry and every collector registered in it: the exposition gathers the one,
/// the reference page and `family_names` read the other, so a family registered is a
/// family documented, whether it has series yet or not.
#[derive(Clone, Default)]
struct Catalogued {
    registry: Registry,
    collectors: Arc<Mutex<Vec<Box<dyn Collector>>>>,
}

impl Catalogued {
    /// Registers `collector` and keeps it for the catalogue.
    fn add<C: Collector + Clone + 'static>(&self, collector: &C) {
        self.registry
            .register(Box::new(collector.clone()))
            .expect("unique metric");
        self.collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(collector.clone()));
    }

    /// The descriptions and current families of every collector, in registration order.
    fn described(
        &self,
    ) -> Vec<(
        Vec<prometheus::core::Desc>,
        Vec<prometheus::proto::MetricFamily>,
    )> {
        self.collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|c| (c.desc().into_iter().cloned().collect(), c.collect()))
            .collect()
    }
}

/// Every metric rollgate exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Catalogued,
    /// Log lines that could not be written (stderr full or closed), read at each scrape.
    log_lines_dropped: IntCounter,
    /// HTTP requests by route pattern, method, status code and client.
    pub http_requests: IntCounterVec,
    /// HTTP request latency by route pattern.
    pub http_duration: HistogramVec,
    /// Events accepted into the queue, by type.
    pub events_queued: IntCounterVec,
    /// Events processed by the worker, by type.
    pub events_processed: IntCounterVec,
    /// Redelivered events skipped because they were processed before, by type.
    pub events_duplicate: IntCounterVec,
    /// Events moved to the dead-letter queue, by type (`unknown` when undecodable).
    pub events_dead_lettered: IntCounterVec,
    /// Queue operations that failed, by operation.
    pub queue_errors: IntCounterVec,
    /// Messages waiting in the queue.
    pub queue_depth: IntGauge,
    /// Messages in the dead-letter queue.
    pub dead_depth: IntGauge,
    /// Runs by status.
    pub runs: IntGaugeVec,
    /// Step durations by run kind and step.
    pub step_duration: HistogramVec,
    /// The oldest last-transition time among running and waiting runs (now when none).
    pub stalest_transition: prometheus::Gauge,
    /// The current gate verdict: 1 for the verdict in force, 0 for the others.
    pub gate_verdict: IntGaugeVec,
    /// The alerts holding the gate at its last evaluation, by name and source.
    pub gate_blockers: IntGaugeVec,
    /// Gate source reads by source and outcome.
    pub gate_evaluations: IntCounterVec,
    /// Notifications by sink and outcome (sent, retried, failed).
    pub notifications: IntCounterVec,
    /// 1 while this replica's worker is the active one (holds the worker lease).
    pub worker_active: IntGauge,
    /// 1 while a Kubernetes upgrade is in flight (the name the Upgrade Gates alerts use).
    pub upgrade_in_flight: IntGauge,
    /// 1 once the in-flight upgrade's etcd snapshot is taken.
    pub upgrade_snapshot_taken: IntGauge,
    /// The stage number (0–7) of the upgrade step in hand; -1 when none is.
    pub upgrade_stage: IntGauge,
    /// 1 for the node the upgrade has in hand, from its drain to its uncordon (alerts that
    /// rollgate's own work causes there may be inhibited by it); no series when none.
    pub upgrade_node_in_hand: IntGaugeVec,
    /// Per upstream cluster, 1 when the version last asked about may go on from it.
    pub fleet_upstream_ready: IntGaugeVec,
    /// Per upstream cluster, the seconds of its soak left by its clock (0 once soaked,
    /// -1 when no soak has begun).
    pub fleet_soak_remaining: IntGaugeVec,
    /// 1 while a maintenance window is open (or none is configured), else 0.
    pub window_open: IntGauge,
    /// When the maintenance window open now, or the next one, opens (Unix seconds); 0 with
    /// no window configured.
    pub window_opening: IntGauge,
    /// How long each node's last step of each kind took. A gauge, not a histogram: a
    /// histogram per node puts a dozen samples per node and step into every scrape.
    node_step_last_duration: GaugeVec,
    /// The workflows' own families, by their set's type.
    sets: Arc<Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>>,
}

/// A workflow's own metric families: made with the others by every `Metrics` once their
/// type is registered (`register_sets`, from the workflows' registry), and taken with
/// `Metrics::set`.
pub trait MetricSet: Send + Sync + 'static {
    /// Makes the families, each registered through `families`.
    fn new(families: &Families) -> Self;
}

/// What a metric set registers its families with.
pub struct Families<'a>(&'a Catalogued);

impl Families<'_> {
    /// Registers `collector` (its name must be unique) and gives it back.
    pub fn add<C: Collector + Clone + 'static>(&self, collector: C) -> C {
        self.0.add(&collector);
        collector
    }
}

/// A metric set's type, as the registry of the workflows lists it.
#[derive(Clone, Copy)]
pub struct MetricSetType {
    id: fn() -> TypeId,
    make: fn(&Families) -> Arc<dyn Any + Send + Sync>,
}

impl MetricSetType {
    /// The type of set `T`.
    pub const fn of<T: MetricSet>() -> Self {
        Self {
            id: TypeId::of::<T>,
            make: make_set::<T>,
        }
    }
}

fn make_set<T: MetricSet>(families: &Families) -> Arc<dyn Any + Send + Sync> {
    Arc::new(T::new(families))
}

/// The metric sets every `Metrics` makes.
static SETS: Mutex<Vec<MetricSetType>> = Mutex::new(Vec::new());

/// Adds `types` to the sets every `Metrics` made from now on makes, so that the exposition
/// and the reference page show their families before anything sets them. Registering a
/// set again changes nothing.
pub fn register_sets(types: &[MetricSetType]) {
    let mut sets = SETS.lock().unwrap_or_else(|e| e.into_inner());
    for t in types {
        if !sets.iter().any(|known| (known.id)() == (t.id)()) {
            sets.push(*t);
        }
    }
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Self {
        let registry = Catalogued::default();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.add(&c);
            c
        };
        let http_requests = counter(
            "rollgate_http_requests_total",
            "HTTP requests by route, code and client (the token's name; - when unauthenticated).",
            &["route", "method", "code", "client"],
        );
        let events_queued = counter(
            "rollgate_events_queued_total",
            "Events durably queued, by type.",
            &["type"],
        );
        let events_processed = counter(
            "rollgate_events_processed_total",
            "Events processed, by type.",
            &["type"],
        );
        let events_duplicate = counter(
            "rollgate_events_duplicate_total",
            "Redelivered events already processed, by type.",
            &["type"],
        );
        let events_dead_lettered = counter(
            "rollgate_events_dead_lettered_total",
            "Events dead-lettered, by type.",
            &["type"],
        );
        let queue_errors = counter(
            "rollgate_queue_errors_total",
            "Failed queue operations, by operation.",
            &["op"],
        );
        let http_duration = HistogramVec::new(
            HistogramOpts::new(
                "rollgate_http_request_duration_seconds",
                "HTTP request latency by route.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
            ]),
            &["route"],
        )
        .expect("valid metric");
        registry.add(&http_duration);
        let step_duration = HistogramVec::new(
            HistogramOpts::new(
                "rollgate_step_duration_seconds",
                "Step durations by run kind and step.",
            )
            .buckets(vec![0.1, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0]),
            &["kind", "step"],
        )
        .expect("valid metric");
        registry.add(&step_duration);
        let queue_depth = IntGauge::new("rollgate_queue_depth", "Messages waiting in the queue.")
            .expect("valid metric");
        registry.add(&queue_depth);
        let dead_depth = IntGauge::new(
            "rollgate_dead_letter_depth",
            "Messages in the dead-letter queue.",
        )
        .expect("valid metric");
        registry.add(&dead_depth);
        let gate_evaluations = counter(
            "rollgate_gate_evaluations_total",
            "Gate source reads by source and outcome.",
            &["source", "outcome"],
        );
        let notifications = counter(
            "rollgate_notifications_total",
            "Notifications by sink and outcome.",
            &["sink", "outcome"],
        );
        let gate_verdict = IntGaugeVec::new(
            Opts::new("rollgate_gate_verdict", "1 for the gate verdict in force."),
            &["verdict"],
        )
        .expect("valid metric");
        registry.add(&gate_verdict);
        let gate_blockers = IntGaugeVec::new(
            Opts::new(
                "rollgate_gate_blockers",
                "Alerts holding the gate at its last evaluation, by alert name and source.",
            ),
            &["alertname", "source"],
        )
        .expect("valid metric");
        registry.add(&gate_blockers);
        let stalest_transition = prometheus::Gauge::new(
            "rollgate_stalest_run_transition_timestamp_seconds",
            "Oldest last-transition time among running and waiting runs; now when there are none.",
        )
        .expect("valid metric");
        registry.add(&stalest_transition);
        let runs = IntGaugeVec::new(Opts::new("rollgate_runs", "Runs by status."), &["status"])
            .expect("valid metric");
        registry.add(&runs);
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry.add(&g);
            g
        };
        let worker_active = gauge(
            "rollgate_worker_active",
            "1 while this replica's worker is the active one (holds the worker lease), else 0.",
        );
        let upgrade_in_flight = gauge(
            "k8s_upgrade_in_flight",
            "1 while a Kubernetes version upgrade is in flight.",
        );
        let upgrade_snapshot_taken = gauge(
            "k8s_upgrade_snapshot_taken",
            "1 once the in-flight upgrade's pre-upgrade etcd snapshot is taken.",
        );
        let upgrade_stage = gauge(
            "k8s_upgrade_stage",
            "Stage number (0-7) of the upgrade step in hand; -1 when none.",
        );
        upgrade_stage.set(-1);
        let window_open = gauge(
            "rollgate_maintenance_window_open",
            "1 while a maintenance window is open (or none is configured), else 0.",
        );
        window_open.set(1);
        let window_opening = gauge(
            "rollgate_maintenance_window_opening_timestamp_seconds",
            "When the maintenance window open now, or the next one, opens (Unix time); 0 with no window.",
        );
        let upgrade_node_in_hand = IntGaugeVec::new(
            Opts::new(
                "k8s_upgrade_node_in_hand",
                "1 for the node an upgrade has in hand, from its drain to its uncordon.",
            ),
            &["node"],
        )
        .expect("valid metric");
        registry.add(&upgrade_node_in_hand);
        let per_upstream = |name: &str, help: &str| {
            let gauge =
                IntGaugeVec::new(Opts::new(name, help), &["upstream"]).expect("valid metric");
            registry.add(&gauge);
            gauge
        };
        let fleet_upstream_ready = per_upstream(
            "rollgate_fleet_upstream_ready",
            "1 when the version last asked about may go on from this upstream cluster, else 0.",
        );
        let fleet_soak_remaining = per_upstream(
            "rollgate_fleet_soak_remaining_seconds",
            "Seconds of the upstream cluster's soak left, by its clock; -1 before one began.",
        );
        let node_step_last_duration = GaugeVec::new(
            Opts::new(
                "rollgate_node_step_last_duration_seconds",
                "How long the node's last step of this kind took, by step and node (their \
                 distribution: rollgate_step_duration_seconds).",
            ),
            &["step", "node"],
        )
        .expect("valid metric");
        registry.add(&node_step_last_duration);
        let log_lines_dropped = IntCounter::new(
            "rollgate_log_lines_dropped_total",
            "Log lines that could not be written (stderr full or closed) and were dropped.",
        )
        .expect("valid metric");
        registry.add(&log_lines_dropped);
        let registered: Vec<MetricSetType> = SETS.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let families = Families(&registry);
        let sets = registered
            .iter()
            .map(|t| ((t.id)(), (t.make)(&families)))
            .collect();
        Self {
            sets: Arc::new(Mutex::new(sets)),
            log_lines_dropped,
            worker_active,
            upgrade_in_flight,
            upgrade_snapshot_taken,
            upgrade_stage,
            upgrade_node_in_hand,
            fleet_upstream_ready,
            fleet_soak_remaining,
            window_open,
            window_opening,
            node_step_last_duration,
            registry,
            http_requests,
            http_duration,
            events_queued,
            events_processed,
            events_duplicate,
            events_dead_lettered,
            queue_errors,
            queue_depth,
            dead_depth,
            runs,
            step_duration,
            stalest_transition,
            gate_verdict,
            gate_evaluations,
            gate_blockers,
            notifications,
        }
    }

    /// The families of set `T`: made with this `Metrics` when registered, else now.
    pub fn set<T: MetricSet>(&self) -> Arc<T> {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let set = sets
            .entry(TypeId::of::<T>())
            .or_insert_with(|| make_set::<T>(&Families(&self.registry)))
            .clone();
        match set.downcast::<T>() {
            Ok(set) => set,
            // Keyed by its own type: only a `T` is ever stored under it.
            Err(_) => unreachable!("a metric set stored under another type's key"),
        }
    }

    /// The name of every metric family rollgate exports, whether it has series yet or not
    /// (a labelled family shows in the exposition only once it has one).
    pub fn family_names(&self) -> Vec<String> {
        self.registry
            .described()
            .into_iter()
            .flat_map(|(descs, _)| descs)
            .map(|d| d.fq_name)
            .collect()
    }

    /// Every metric family with its type, labels and help: the reference page.
    pub fn catalogue(&self) -> Vec<MetricFamilyDoc> {
        use prometheus::proto::MetricType;
        let mut out = Vec::new();
        for (descs, families) in self.registry.described() {
            let kinds: Vec<MetricType> = families.iter().map(|f| f.get_field_type()).collect();
            for (i, desc) in descs.into_iter().enumerate() {
                let kind = match kinds.get(i) {
                    Some(MetricType::COUNTER) => "counter",
                    Some(MetricType::GAUGE) => "gauge",
                    Some(MetricType::HISTOGRAM) => "histogram",
                    Some(MetricType::SUMMARY) => "summary",
                    _ => "untyped",
                };
                out.push(MetricFamilyDoc {
                    name: desc.fq_name,
                    kind,
                    labels: desc.variable_labels,
                    help: desc.help,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Records how long a node's step took: one sample per node and step kind, however many
    /// times the step ran.
    pub fn node_step_took(&self, step: &str, node: &str, seconds: f64) {
        self.node_step_last_duration
            .with_label_values(&[step, node])
            .set(seconds);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for the metric types used here.
        let dropped = crate::logging::dropped_lines();
        self.log_lines_dropped
            .inc_by(dropped.saturating_sub(self.log_lines_dropped.get()));
        let _ = TextEncoder::new().encode(&self.registry.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// One metric family as the reference page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricFamilyDoc {
    /// The family's name.
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its labels.
    pub labels: Vec<String>,
    /// Its help text.
    pub help: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_names_cover_every_registered_family() {
        let m = Metrics::new();
        let names = m.family_names();
        let exposed: std::collections::BTreeSet<String> = m
            .registry
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        for name in &exposed {
            assert!(names.contains(name), "{name} missing from family_names");
        }
        let unique: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    struct Registered(IntCounter);
    impl MetricSet for Registered {
        fn new(families: &Families) -> Self {
            Self(families.add(IntCounter::new("test_registered_total", "a").expect("valid")))
        }
    }
    struct Unregistered(IntCounter);
    impl MetricSet for Unregistered {
        fn new(families: &Families) -> Self {
            Self(families.add(IntCounter::new("test_unregistered_total", "b").expect("valid")))
        }
    }

    /// A registered set's families are there from the start, on the reference page and in
    /// the exposition; one never registered is made on first use, once.
    #[test]
    fn a_workflows_set_is_made_with_the_metrics_and_taken_back_by_its_type() {
        register_sets(&[MetricSetType::of::<Registered>()]);
        register_sets(&[MetricSetType::of::<Registered>()]);
        let m = Metrics::new();
        assert!(
            m.family_names()
                .contains(&"test_registered_total".to_owned())
        );
        assert!(m.render().contains("test_registered_total 0"));
        assert!(
            !m.family_names()
                .contains(&"test_unregistered_total".to_owned())
        );
        m.set::<Registered>().0.inc();
        m.set::<Unregistered>().0.inc_by(2);
        m.set::<Unregistered>().0.inc();
        let text = m.render();
        assert!(text.contains("test_registered_total 1"), "{text}");
        assert!(text.contains("test_unregistered_total 3"), "{text}");
        assert!(Metrics::new().render().contains("test_registered_total 0"));
    }

    /// A node's steps, however often they run, add one sample per step kind to every
    /// scrape: at 1,000 nodes a scrape stays thousands of lines, not tens of thousands.
    #[test]
    fn a_node_adds_one_sample_per_step_kind_to_the_exposition() {
        let m = Metrics::new();
        let before = m.render().lines().count();
        for node in 0..100 {
            for step in ["drain", "upgrade", "verify", "uncordon"] {
                for seconds in [10.0, 20.0, 30.0] {
                    m.node_step_took(step, &format!("worker-{node}"), seconds);
                }
            }
        }
        let text = m.render();
        // 400 samples, and the family's HELP and TYPE lines.
        assert_eq!(text.lines().count() - before, 402);
        assert!(
            text.contains(
                "rollgate_node_step_last_duration_seconds{node=\"worker-7\",step=\"verify\"} 30\n"
            ),
            "{text}"
        );
    }
}
