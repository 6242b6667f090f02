//! Reading deploy/: YAML documents, and what its ClusterRoles grant.

use k8s_openapi::api::rbac::v1::ClusterRole;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// Copies `from` into `to`, directories included.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// The example overlay's secret generators (rollgate-secrets, rollgate-clients).
pub fn example_secret_generators() -> Vec<Value> {
    let overlay = root().join("deploy/overlays/example");
    documents(&overlay.join("kustomization.yaml"))[0]["secretGenerator"]
        .as_array()
        .expect("secret generators")
        .clone()
}

/// `kubectl kustomize deploy/overlays/NAME` in a copy of deploy/ with the secret files
/// the example overlay expects: the temp dir (holding `built.yaml`) and the objects.
pub fn kustomize(name: &str) -> (tempfile::TempDir, Vec<Value>) {
    let version = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .expect("kubectl (scripts/test.sh installs it: Debian's kubernetes-client)");
    assert!(version.status.success());
    let dir = tempfile::tempdir().unwrap();
    let deploy = dir.path().join("deploy");
    copy_tree(&root().join("deploy"), &deploy);
    let example = deploy.join("overlays/example");
    for generator in example_secret_generators() {
        for file in generator["files"].as_array().unwrap() {
            let (key, path) = file.as_str().unwrap().split_once('=').unwrap();
            let path = example.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("test {key}\n")).unwrap();
        }
    }
    // The overlay's own Secrets' files, when it makes any beside the example's.
    let overlay = deploy.join("overlays").join(name);
    if name != "example" {
        let own = documents(&overlay.join("kustomization.yaml"))[0]["secretGenerator"].clone();
        for generator in own.as_array().into_iter().flatten() {
            for file in generator["files"].as_array().unwrap() {
                let (key, path) = file.as_str().unwrap().split_once('=').unwrap();
                let path = overlay.join(path);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, format!("test {key}\n")).unwrap();
            }
        }
    }
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = dir.path().join("built.yaml");
    std::fs::write(&built, &out.stdout).unwrap();
    let docs = documents(&built);
    (dir, docs)
}
