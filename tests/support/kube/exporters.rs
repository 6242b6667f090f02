//! What a real cluster's exporters would say about the fake, as Prometheus targets:
//! `/metrics` the API servers' `kubernetes_build_info` (one series per control plane, from
//! its kube-apiserver mirror pod's image), `/metrics/kubelet` every kubelet's, and
//! `/metrics/kube-state` kube-state-metrics' node conditions, unschedulable flags and
//! container waiting reasons, with node-exporter's boot times (a node's changes when it
//! comes back with another boot id).

use super::state::State;
use serde_json::json;

/// The Prometheus text of the exporter at `/metrics/<path>`.
pub fn exposition(s: &State, path: &[&str]) -> Option<String> {
    let mut out = String::new();
    let mut line = |metric: &str, labels: &[(&str, &str)], value: f64| {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        out.push_str(&format!("{metric}{{{}}} {value}\n", labels.join(",")));
    };
    match path {
        [] => {
            for pod in s.all("pods") {
                let name = pod["metadata"]["name"].as_str().unwrap_or("");
                let Some(node) = name.strip_prefix("kube-apiserver-") else {
                    continue;
                };
                if pod["metadata"]["namespace"] != "kube-system" {
                    continue;
                }
                let image = pod["spec"]["containers"][0]["image"].as_str().unwrap_or("");
                let tag = image.rsplit_once(':').map_or("", |(_, v)| v);
                let version = git_version_of_tag(tag);
                line(
                    "kubernetes_build_info",
                    &[("git_version", &version), ("node", node)],
                    1.0,
                );
            }
            // k3s serves the API from the process that runs the server's kubelet: its
            // version is the node's.
            let k3s_server = |node: &serde_json::Value| {
                node["metadata"]["annotations"]["k3s.io/hostname"].is_string()
                    && node["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] == "true"
            };
            kubelet_build_info(s, &mut line, k3s_server);
        }
        ["kubelet"] => kubelet_build_info(s, &mut line, |_| true),
        ["kube-state"] => {
            for node in s.all("nodes") {
                let name = node["metadata"]["name"].as_str().unwrap_or("");
                let ready = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready")
                    .and_then(|c| c["status"].as_str())
                    .unwrap_or("Unknown")
                    .to_lowercase();
                for status in ["true", "false", "unknown"] {
                    let value = f64::from(u8::from(ready == status));
                    line(
                        "kube_node_status_condition",
                        &[("node", name), ("condition", "Ready"), ("status", status)],
                        value,
                    );
                }
                let cordoned = node["spec"]["unschedulable"] == json!(true);
                line(
                    "kube_node_spec_unschedulable",
                    &[("node", name)],
                    f64::from(u8::from(cordoned)),
                );
                let booted = s.node_booted.get(name).copied().unwrap_or(s.booted_at);
                line("node_boot_time_seconds", &[("node", name)], booted as f64);
            }
            for pod in s.all("pods") {
                let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
                let name = pod["metadata"]["name"].as_str().unwrap_or("");
                for c in pod["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if let Some(reason) = c["state"]["waiting"]["reason"].as_str() {
                        let container = c["name"].as_str().unwrap_or("");
                        line(
                            "kube_pod_container_status_waiting_reason",
                            &[
                                ("namespace", ns),
                                ("pod", name),
                                ("container", container),
                                ("reason", reason),
                            ],
                            1.0,
                        );
                    }
                }
            }
        }
        _ => return None,
    }
    Some(out)
}

/// The version an API server running image tag `tag` reports: RKE2's hardened images are
/// tagged `v1.34.5-rke2r1-build20250101` and report `v1.34.5+rke2r1`; any other tag is
/// the version itself.
fn git_version_of_tag(tag: &str) -> String {
    match tag.split_once("-rke2r") {
        Some((version, rest)) => {
            let build = rest.split('-').next().unwrap_or(rest);
            format!("{version}+rke2r{build}")
        }
        None => tag.to_owned(),
    }
}

/// `kubernetes_build_info` of the kubelet of every node `of` picks, as its node reports it.
fn kubelet_build_info(
    s: &State,
    line: &mut impl FnMut(&str, &[(&str, &str)], f64),
    of: impl Fn(&serde_json::Value) -> bool,
) {
    for node in s.all("nodes").filter(|n| of(n)) {
        let name = node["metadata"]["name"].as_str().unwrap_or("");
        let version = node["status"]["nodeInfo"]["kubeletVersion"]
            .as_str()
            .unwrap_or("");
        line(
            "kubernetes_build_info",
            &[("git_version", version), ("node", name)],
            1.0,
        );
    }
}
