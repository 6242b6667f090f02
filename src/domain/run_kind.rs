//! The kinds of run: one per workflow that makes runs.

use serde::{Deserialize, Serialize};

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunKind {
    /// A kubeadm Kubernetes version upgrade.
    K8sUpgrade,
    /// A roll of an etcd cluster's members onto a new revision.
    EtcdRoll,
    /// Reboots of the nodes whose reboot sentinel is set.
    NodeReboot,
}

impl RunKind {
    /// The name used in the API and in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::K8sUpgrade => "k8s-upgrade",
            Self::EtcdRoll => "etcd-roll",
            Self::NodeReboot => "node-reboot",
        }
    }
}
