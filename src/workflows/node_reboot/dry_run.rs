//! A reboot request's dry run (`"dry_run": true`): what a run asked now would do, read
//! from the cluster and the nodes' sentinels, with nothing queued, marked or touched.

use serde::Serialize;
use std::collections::BTreeMap;

use super::plan::{self, RebootPlanError, RebootPlanSettings};
use super::{NodeReboots, RebootRequest, sentinel};
use crate::ports::NodeTarget;
use crate::workflows::k8s_upgrade::plan::ClusterFacts;

/// What a reboot run asked now would do (the answer to a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RebootDryRun {
    /// Always true: nothing was queued or touched.
    pub dry_run: bool,
    /// The control planes to reboot, one at a time between health checks; the etcd
    /// leader's last, after one leadership move.
    pub control_planes: Vec<String>,
    /// The workers to reboot, batch by batch, in order (`cluster.worker_order`,
    /// `cluster.max_unavailable`); each batch behind one gate, followed by one soak.
    pub batches: Vec<Vec<String>>,
    /// Nodes asked for that would not be rebooted, each with why.
    pub left_out: Vec<String>,
    /// Nodes whose sentinel could not be read, with why (not planned).
    pub unreadable: BTreeMap<String, String>,
    /// What would hold the run if it started now: the gate, the maintenance window,
    /// another run holding the cluster, what holds a node's drain. Empty: it would go.
    pub holds: Vec<String>,
}

impl NodeReboots {
    /// The plan `request` would get now, and what would hold each node's drain (the
    /// holds of the run as a whole are the caller's to add). Reads the sentinels side by
    /// side; changes nothing, not even the metrics of what was read.
    pub async fn dry_run(
        &self,
        request: &RebootRequest,
        facts: &ClusterFacts,
        settings: &RebootPlanSettings,
    ) -> Result<RebootDryRun, RebootPlanError> {
        plan::check_request(request, facts, settings)?;
        let reads = plan::candidates(request, facts, settings)
            .into_iter()
            .filter_map(|name| facts.node(&name).map(NodeTarget::from))
            .map(|target| async move {
                let read = sentinel(&*self.exec, &target, &self.settings.sentinel_script).await;
                (target.name, read)
            });
        let mut needs = BTreeMap::new();
        let mut unreadable = BTreeMap::new();
        for (node, read) in futures_util::future::join_all(reads).await {
            match read {
                Ok(set) => {
                    needs.insert(node, set);
                }
                Err(e) => {
                    unreadable.insert(node, crate::error_chain(&e));
                }
            }
        }
        let planned = plan::plan(request, facts, &needs, settings)?;
        let mut holds = Vec::new();
        for node in planned.control_planes.iter().chain(&planned.workers) {
            match self.cycle.holds_now(node).await {
                Ok(found) => holds.extend(found.into_iter().map(|h| format!("{node}: {h}"))),
                Err(e) => holds.push(format!(
                    "{node}: its drain cannot be judged now ({})",
                    crate::error_chain(&e)
                )),
            }
        }
        Ok(RebootDryRun {
            dry_run: true,
            control_planes: planned.control_planes,
            batches: planned
                .workers
                .chunks(planned.batch_size.max(1))
                .map(<[String]>::to_vec)
                .collect(),
            left_out: planned.left_out,
            unreadable,
            holds,
        })
    }
}
