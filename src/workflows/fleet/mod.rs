//! Fleet waves: a version reaches this cluster only after every cluster upstream ran it
//! and its gate stayed quiet for a soak. Each rollgate tells about its own cluster
//! (`GET /v1/fleet`), keeps the time since which its gate has been quiet (in the store),
//! and asks its upstreams before an upgrade goes ahead (the `upstreams` step).

pub mod config;
pub mod view;

use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::domain::engine::{AWAITS_APPROVAL, StepOutcome};
use crate::domain::gate::Verdict;
use crate::domain::run::Run;
use crate::domain::run_request::schema_of;
use crate::domain::version::Version;
use crate::metrics::Metrics;
use crate::ports::{ClusterRead, FleetPeer, StepExecutor};
use crate::store::Store;
use crate::workflows::gate::{Gate, GateReport};
use crate::workflows::view::{View, ViewDoor};

pub use config::{FleetConfig, Upstream};
use view::{FiringBlocker, FleetView, GateQuiet, LastRun, UpstreamView, Versions, readiness};

/// How deep the views of upstreams' upstreams are kept: a chain longer than this (or a
/// loop of clusters naming each other) is cut there.
const MAX_DEPTH: usize = 8;

/// Why the fleet could not be set up; names the key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FleetError(String);

/// `GET /v1/fleet`, what downstream clusters ask.
pub static VIEW: ViewDoor = ViewDoor {
    path: "fleet",
    summary: "this cluster as its downstream clusters see it: its name, the versions it runs, its last run of each kind, its gate and since when it has been quiet, and how it sees its own upstreams.",
    body: schema_of::<FleetView>,
};

/// One upstream and the peer that asks it.
struct Asked {
    upstream: Upstream,
    peer: Arc<dyn FleetPeer>,
}

/// This rollgate's part in the fleet.
pub struct Fleet {
    config: FleetConfig,
    store: Store,
    gate: Arc<Gate>,
    cluster: Option<Arc<dyn ClusterRead>>,
    metrics: Metrics,
    upstreams: Vec<Asked>,
    /// The last answer of each upstream, by name, for `GET /v1/fleet`.
    seen: Mutex<BTreeMap<String, UpstreamView>>,
}

#[async_trait::async_trait]
impl View for Fleet {
    fn door(&self) -> &'static ViewDoor {
        &VIEW
    }

    async fn read(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self.view().await)
    }
}

impl Fleet {
    /// The fleet of `config`, whose upstreams are asked through `peers`, one per entry of
    /// `config.upstreams`, in the same order.
    pub fn new(
        config: FleetConfig,
        store: Store,
        gate: Arc<Gate>,
        cluster: Option<Arc<dyn ClusterRead>>,
        metrics: Metrics,
        peers: Vec<Arc<dyn FleetPeer>>,
    ) -> Result<Self, FleetError> {
        if peers.len() != config.upstreams.len() {
            return Err(FleetError(format!(
                "{} upstreams and {} peers to ask them",
                config.upstreams.len(),
                peers.len()
            )));
        }
        let upstreams = config
            .upstreams
            .iter()
            .cloned()
            .zip(peers)
            .map(|(upstream, peer)| Asked { upstream, peer })
            .collect();
        Ok(Self {
            config,
            store,
            gate,
            cluster,
            metrics,
            upstreams,
            seen: Mutex::new(BTreeMap::new()),
        })
    }

    /// Whether an upgrade here waits for upstreams.
    pub fn has_upstreams(&self) -> bool {
        !self.upstreams.is_empty()
    }

    /// This rollgate's view of its cluster and of its upstreams, as last asked.
    pub async fn view(&self) -> FleetView {
        let now = Utc::now();
        let report = match self.gate.last() {
            Some(report) => report,
            None => self.gate.evaluate().await,
        };
        let quiet_since = match self.store.quiet_since().await {
            Ok(since) => since,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "quiet_since cannot be read");
                None
            }
        };
        FleetView {
            name: self.config.name.clone(),
            now,
            versions: self.versions().await,
            last_runs: self.last_runs().await,
            gate: gate_quiet(&report, quiet_since),
            upstreams: self
                .seen
                .lock()
                .map(|seen| seen.values().cloned().collect())
                .unwrap_or_default(),
        }
    }

    async fn versions(&self) -> Versions {
        let Some(cluster) = &self.cluster else {
            return Versions::default();
        };
        let mut versions = Versions::default();
        let facts = match cluster.facts().await {
            Ok(facts) => facts,
            Err(e) => {
                versions.error = Some(e.to_string());
                return versions;
            }
        };
        for node in &facts.nodes {
            *versions
                .kubelet
                .entry(node.kubelet.to_string())
                .or_insert(0) += 1;
            if node.role != crate::workflows::k8s_upgrade::plan::Role::ControlPlane {
                continue;
            }
            match cluster.static_pods(&node.name).await {
                Ok(pods) => {
                    for pod in pods.iter().filter(|p| p.component == "kube-apiserver") {
                        let version = pod
                            .version
                            .map_or_else(|| "unknown".to_owned(), |v| v.to_string());
                        *versions.api_server.entry(version).or_insert(0) += 1;
                    }
                }
                Err(e) => versions.error = Some(e.to_string()),
            }
        }
        versions
    }

    async fn last_runs(&self) -> BTreeMap<String, LastRun> {
        let mut last = BTreeMap::new();
        let runs = match self.store.list_summaries(None, 200).await {
            Ok(runs) => runs,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "runs cannot be read for the fleet view");
                return last;
            }
        };
        for run in runs {
            last.entry(run.kind.name().to_owned())
                .or_insert_with(|| LastRun {
                    id: run.id.clone(),
                    status: run.status.name().to_owned(),
                    target: run.target.clone(),
                    ended_at: run.status.is_terminal().then_some(run.updated_at),
                });
        }
        last
    }

    /// Asks every upstream about `target` (or, without one, the version this cluster's
    /// API server runs), keeps their answers for the view and the metrics, and says what
    /// holds `target` back; empty when every upstream is ready.
    pub async fn ask_upstreams(&self, target: Option<Version>) -> Vec<String> {
        let target = match target {
            Some(t) => Some(t),
            None => match &self.cluster {
                Some(cluster) => cluster.api_server_version().await.ok(),
                None => None,
            },
        };
        let answers =
            futures_util::future::join_all(self.upstreams.iter().map(|asked| self.ask(asked)))
                .await;
        let mut blockers = Vec::new();
        for (asked, answer) in self.upstreams.iter().zip(answers) {
            let name = &asked.upstream.name;
            let state = target.map(|t| {
                readiness(
                    name,
                    t,
                    self.config.soak,
                    answer.as_ref().map_err(String::as_str),
                )
            });
            let ready = state.as_ref().is_some_and(|s| s.ready);
            self.metrics
                .fleet_upstream_ready
                .with_label_values(&[name])
                .set(i64::from(ready));
            let remaining = state.as_ref().and_then(|s| s.soak_remaining);
            self.metrics
                .fleet_soak_remaining
                .with_label_values(&[name])
                .set(remaining.map_or(-1, |r| i64::try_from(r.as_secs()).unwrap_or(i64::MAX)));
            let upstream_blockers = match (&state, &answer) {
                (Some(state), _) => state.blockers.clone(),
                (None, Err(why)) => vec![format!("{name}: unreachable ({why})")],
                (None, Ok(_)) => vec![format!(
                    "{name}: no version to ask about (this cluster's cannot be read)"
                )],
            };
            blockers.extend(upstream_blockers.iter().cloned());
            let seen = UpstreamView {
                name: name.clone(),
                url: asked.upstream.url.clone(),
                version: target.map(|t| t.to_string()),
                ready,
                blockers: upstream_blockers,
                soak_until: state.as_ref().and_then(|s| s.soak_until),
                soak_remaining_secs: remaining.map(|r| r.as_secs()),
                asked_at: Utc::now(),
                view: answer.ok().map(|v| Box::new(cut(v, MAX_DEPTH))),
            };
            if let Ok(mut all) = self.seen.lock() {
                all.insert(name.clone(), seen);
            }
        }
        if target.is_none() && !self.upstreams.is_empty() {
            blockers.push("this cluster's version cannot be read".into());
        }
        blockers
    }

    async fn ask(&self, asked: &Asked) -> Result<FleetView, String> {
        let answer = asked.peer.fleet_view().await?;
        let view: FleetView = serde_json::from_value(answer)
            .map_err(|e| format!("its answer is not a fleet view: {e}"))?;
        if view.name != asked.upstream.name {
            return Err(format!(
                "it calls itself {:?}, not {:?}",
                view.name, asked.upstream.name
            ));
        }
        Ok(view)
    }

    /// Keeps `quiet_since` in the store as the gate changes: a blocking alert firing ends
    /// the quiet time, the gate seen open again starts it. An unknown verdict changes
    /// nothing (rollgate starting, a source down): it proves neither.
    pub async fn keep_quiet_since(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut changes = self.gate.verdict_changes();
        let mut tick = tokio::time::interval(self.config.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let report = changes.borrow_and_update().clone();
            if let Some(report) = report {
                self.record(&report).await;
            }
            // Until the verdict changes, only the upstreams are asked (for the view and
            // the metrics).
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    changed = changes.changed() => match changed {
                        Ok(()) => break,
                        Err(_) => return,
                    },
                    _ = tick.tick() => {
                        if self.has_upstreams() {
                            self.ask_upstreams(None).await;
                        }
                    }
                }
            }
        }
    }

    /// Records `report`'s verdict as the quiet time sees it.
    async fn record(&self, report: &GateReport) {
        let closed = match &report.verdict {
            Verdict::Open => false,
            Verdict::Closed { .. } => true,
            Verdict::Unknown { .. } => return,
        };
        if let Err(e) = self.store.record_gate(closed, report.evaluated_at).await {
            tracing::warn!(error = %crate::error_chain(&e), "quiet_since cannot be kept");
        }
    }
}

/// `view` with its upstreams' views kept `depth` levels deep.
fn cut(mut view: FleetView, depth: usize) -> FleetView {
    for upstream in &mut view.upstreams {
        upstream.view = match (depth, upstream.view.take()) {
            (0, _) | (_, None) => None,
            (_, Some(v)) => Some(Box::new(cut(*v, depth - 1))),
        };
    }
    view
}

fn gate_quiet(report: &GateReport, quiet_since: Option<DateTime<Utc>>) -> GateQuiet {
    let blockers = match &report.verdict {
        Verdict::Closed { blockers } => blockers
            .iter()
            .map(|b| FiringBlocker {
                name: b.name.clone(),
                since: b.since,
            })
            .collect(),
        Verdict::Open | Verdict::Unknown { .. } => Vec::new(),
    };
    GateQuiet {
        verdict: report.verdict.name().into(),
        reasons: report.verdict.reasons(),
        // While a blocking alert fires nothing is quiet, whatever the store last kept.
        quiet_since: match report.verdict {
            Verdict::Closed { .. } => None,
            Verdict::Open | Verdict::Unknown { .. } => quiet_since,
        },
        blockers,
    }
}

/// The `upstreams` step of an upgrade's pre-flight: waits until every upstream ran the
/// target and stayed quiet for `fleet.soak`, then (with `fleet.require_approval`) for an
/// approval; past `fleet.max_wait` it fails and the run halts.
pub struct UpstreamsStep(pub Arc<Fleet>);

#[async_trait::async_trait]
impl StepExecutor for UpstreamsStep {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let fleet = &self.0;
        let Some(target) = run.target.as_deref().and_then(|t| Version::parse(t).ok()) else {
            return StepOutcome::failed("the run has no target version to ask the upstreams about");
        };
        let blockers = fleet.ask_upstreams(Some(target)).await;
        let names: Vec<&str> = fleet
            .upstreams
            .iter()
            .map(|a| a.upstream.name.as_str())
            .collect();
        let next = Utc::now()
            + chrono::Duration::from_std(fleet.config.poll_interval)
                .unwrap_or(chrono::Duration::MAX);
        if blockers.is_empty() {
            let soak = humantime::format_duration(fleet.config.soak);
            let promoted = format!(
                "wave promotes {target} to {}: {} ran it and stayed quiet for {soak}",
                fleet.config.name,
                names.join(", ")
            );
            if !fleet.config.require_approval {
                return StepOutcome::Announced { note: promoted };
            }
            return match &run.approved_by {
                Some(by) => StepOutcome::Announced {
                    note: format!("{promoted}; approved by {by}"),
                },
                None => StepOutcome::AwaitApproval {
                    until: next,
                    reason: format!(
                        "{AWAITS_APPROVAL}: upstreams ready ({}); POST /v1/runs/{}/approve with scope runs:approve",
                        names.join(", "),
                        run.id
                    ),
                },
            };
        }
        if crate::clock::over(&run.steps[index], fleet.config.max_wait) {
            return StepOutcome::failed(format!(
                "upstreams not ready within fleet.max_wait ({}): {}",
                humantime::format_duration(fleet.config.max_wait),
                blockers.join("; ")
            ));
        }
        StepOutcome::Wait {
            until: next,
            reason: format!("waits for upstreams: {}", blockers.join("; ")),
        }
    }
}
