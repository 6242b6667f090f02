//! The pods on a node about to be drained and the PodDisruptionBudgets over them, as
//! plain data, with the label selectors that tie the two.

use std::collections::BTreeMap;

/// How a label requirement compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    /// The label is one of the values.
    In,
    /// The label is missing or none of the values.
    NotIn,
    /// The label is set.
    Exists,
    /// The label is not set.
    DoesNotExist,
}

/// One label requirement, as Kubernetes selectors have them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// How it compares.
    pub operator: Operator,
    /// The values `In` and `NotIn` compare with.
    pub values: Vec<String>,
}

impl Requirement {
    /// Parses a blocking-pod selector: `key=value`, `key!=value`, `key` or `!key`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        let (key, operator, values) = if let Some((k, v)) = raw.split_once("!=") {
            (k, Operator::NotIn, vec![v.trim().to_owned()])
        } else if let Some((k, v)) = raw.split_once('=') {
            (k, Operator::In, vec![v.trim().to_owned()])
        } else if let Some(k) = raw.strip_prefix('!') {
            (k, Operator::DoesNotExist, Vec::new())
        } else {
            (raw, Operator::Exists, Vec::new())
        };
        let key = key.trim();
        let key_ok = !key.is_empty()
            && key.len() <= 253
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        let values_ok = values.iter().all(|v| {
            v.len() <= 63
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        });
        if !key_ok || !values_ok {
            return Err(format!(
                "{raw:?} is not a label selector like app=backup, app!=web, backup or !backup"
            ));
        }
        Ok(Self {
            key: key.to_owned(),
            operator,
            values,
        })
    }

    /// Whether `labels` meet this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

impl std::fmt::Display for Requirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.operator {
            Operator::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
        }
    }
}

/// A label selector: `matchLabels` and `matchExpressions`, all of which must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    /// `matchLabels`, as requirements.
    pub requirements: Vec<Requirement>,
}

impl Selector {
    /// Whether `labels` meet every requirement (an empty selector matches every pod, as
    /// policy/v1 budgets do).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// A pod on the node about to be drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// It is running (not Succeeded or Failed, not terminating).
    pub running: bool,
    /// A drain would evict it (not a DaemonSet's, not a mirror pod).
    pub evictable: bool,
}

/// A PodDisruptionBudget as its status says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetFacts {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The pods it covers.
    pub selector: Selector,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
    /// `status.currentHealthy`.
    pub current_healthy: i32,
    /// `status.expectedPods`.
    pub expected_pods: i32,
    /// `status.desiredHealthy`.
    pub desired_healthy: i32,
    /// `metadata.generation`, and the generation `status` was computed for.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: i64,
    /// `metadata.resourceVersion`: changes whenever the status is written.
    pub resource_version: String,
}

/// Whether rollgate itself lets one more eviction under `budget` go now, as read just
/// before it: the API server's own check, kept by rollgate too, so that a server (or an
/// admission path) that admits every eviction still never takes a budget below its floor.
/// The status must be current: computed for the budget's generation, and written since
/// rollgate's last eviction under it (`evicted_at`, the resourceVersion it read before
/// that eviction), so that one eviction is never counted twice as allowed. Then a
/// disruption must be allowed, or the pod must be not Ready while the budget is met (the
/// API's `IfHealthyBudget` policy for unhealthy pods). `Err`: why it waits.
pub fn eviction_may_go(
    budget: &BudgetFacts,
    pod_ready: bool,
    evicted_at: Option<&str>,
) -> Result<(), String> {
    let name = format!("PodDisruptionBudget {}/{}", budget.namespace, budget.name);
    if budget.observed_generation < budget.generation {
        return Err(format!(
            "{name}: its status is not yet computed for its spec"
        ));
    }
    if evicted_at == Some(budget.resource_version.as_str()) {
        return Err(format!(
            "{name}: its status does not yet count rollgate's last eviction under it"
        ));
    }
    let unhealthy_goes = !pod_ready
        && budget.desired_healthy > 0
        && budget.current_healthy >= budget.desired_healthy;
    if budget.disruptions_allowed > 0 || unhealthy_goes {
        return Ok(());
    }
    Err(format!(
        "{name} allows no disruption now ({} of {} desired pods healthy)",
        budget.current_healthy, budget.desired_healthy
    ))
}
