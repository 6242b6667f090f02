//! Reading deploy/: YAML documents, and what its ClusterRoles grant.

use k8s_openapi::api::rbac::v1::ClusterRole;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::kube::Access;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The YAML documents of a file, as JSON values.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// The ClusterRole `name` of deploy/base/rbac.yaml.
pub fn cluster_role(name: &str) -> ClusterRole {
    let path = root().join("deploy/base/rbac.yaml");
    let doc = documents(&path)
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name} in {}", path.display()));
    serde_json::from_value(doc).expect("a ClusterRole")
}

/// What a ClusterRole grants: (group, resource, verb) → the resourceNames it is limited
/// to (empty: any name).
pub fn grants(role: &ClusterRole) -> BTreeMap<(String, String, String), Vec<String>> {
    let mut out = BTreeMap::new();
    for rule in role.rules.iter().flatten() {
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    out.insert(
                        (g.clone(), r.clone(), v.clone()),
                        rule.resource_names.clone().unwrap_or_default(),
                    );
                }
            }
        }
    }
    out
}

/// Every access in `used` is granted by `role`, the object's name included where the
/// grant is limited to names.
pub fn assert_granted(role: &ClusterRole, used: &BTreeSet<Access>) {
    let granted = grants(role);
    for a in used {
        let key = (a.group.clone(), a.resource.clone(), a.verb.clone());
        let names = granted.get(&key).unwrap_or_else(|| {
            panic!(
                "ClusterRole {:?} does not grant {a:?} (it grants {:?})",
                role.metadata.name,
                granted.keys().collect::<Vec<_>>()
            )
        });
        if !names.is_empty() {
            let name = a.name.as_deref().unwrap_or_default();
            assert!(
                names.iter().any(|n| n == name),
                "{a:?}: the grant is limited to {names:?}"
            );
        }
    }
}
