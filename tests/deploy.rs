//! deploy/: every manifest is the typed Kubernetes object it claims to be (nothing lost in
//! a round trip through the k8s-openapi type, so no misspelt field slips by), the RBAC
//! grants every API use the adapters make (found by driving them against the fake API
//! server) and nothing is left unused, the PrometheusRule carries rules/, and the
//! configuration in the ConfigMaps loads.

mod support;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use support::kube::FakeKube;
use support::manifests::{
    assert_granted, cluster_role, documents, example_secret_generators, grants, kustomize, root,
};

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The Prometheus Operator's PrometheusRule (not in k8s-openapi).
#[derive(Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PrometheusRule {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: RuleFile,
}

/// A Prometheus rule file: what rules/ holds and what a PrometheusRule's spec carries.
#[derive(Deserialize, serde::Serialize, PartialEq, Debug)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Deserialize, serde::Serialize, PartialEq, Debug)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interval: Option<String>,
    rules: Vec<Rule>,
}

#[derive(Deserialize, serde::Serialize, PartialEq, Debug)]
#[serde(deny_unknown_fields)]
struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    alert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    record: Option<String>,
    expr: String,
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    for_: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

/// The Prometheus Operator's ServiceMonitor (not in k8s-openapi).
#[derive(Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitorSpec {
    selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    endpoints: Vec<MonitorEndpoint>,
}

#[derive(Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MonitorEndpoint {
    port: String,
    path: String,
    interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tls_config: Option<MonitorTls>,
}

#[derive(Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MonitorTls {
    ca: MonitorSecretRef,
    server_name: String,
}

#[derive(Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct MonitorSecretRef {
    secret: k8s_openapi::api::core::v1::SecretKeySelector,
}

/// A kustomization, the fields deploy/ uses.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kustomization {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    labels: Vec<Value>,
    #[serde(default)]
    images: Vec<Value>,
    #[serde(default)]
    secret_generator: Vec<Value>,
    #[serde(default)]
    config_map_generator: Vec<Value>,
    #[serde(default)]
    patches: Vec<Value>,
}

/// Deserializes `doc` into `T`, serializes it back and demands the same document: a field
/// the type does not know (a typo) would be dropped and show up here.
fn typed<T: DeserializeOwned + serde::Serialize>(doc: &Value, path: &Path) -> T {
    let object: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{}: not a valid {}: {e}", path.display(), doc["kind"]));
    let back = serde_json::to_value(&object).unwrap();
    assert_eq!(
        &back,
        doc,
        "{}: {} lost or changed fields in a round trip through its type",
        path.display(),
        doc["kind"]
    );
    object
}

/// Every manifest under deploy/ (not the examples), by kind.
struct Manifests {
    roles: Vec<ClusterRole>,
    config_maps: Vec<(PathBuf, ConfigMap)>,
    statefulsets: Vec<StatefulSet>,
    cronjobs: Vec<CronJob>,
    rules: Vec<PrometheusRule>,
    budgets: Vec<(PathBuf, PodDisruptionBudget)>,
    /// The operators' clusters (RabbitmqCluster, CloudNativePG's Cluster), untyped.
    operated: Vec<(PathBuf, Value)>,
    /// cert-manager's Certificates, untyped.
    certificates: Vec<(PathBuf, Value)>,
    kinds: BTreeMap<String, usize>,
}

fn manifests() -> Manifests {
    let mut m = Manifests {
        roles: Vec::new(),
        config_maps: Vec::new(),
        statefulsets: Vec::new(),
        cronjobs: Vec::new(),
        rules: Vec::new(),
        budgets: Vec::new(),
        operated: Vec::new(),
        certificates: Vec::new(),
        kinds: BTreeMap::new(),
    };
    for path in yaml_files(&root().join("deploy")) {
        if path.starts_with(root().join("deploy/examples")) {
            continue;
        }
        for doc in documents(&path) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            *m.kinds.entry(kind.clone()).or_default() += 1;
            match kind.as_str() {
                "Kustomization" => {
                    let k: Kustomization = serde_json::from_value(doc.clone())
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    let dir = path.parent().unwrap();
                    for r in k
                        .resources
                        .iter()
                        .map(String::as_str)
                        .chain(k.patches.iter().filter_map(|p| p["path"].as_str()))
                    {
                        assert!(dir.join(r).exists(), "{}: {r} is missing", path.display());
                    }
                    // A generator's files (`key=path` or `path`) exist too.
                    for file in k
                        .config_map_generator
                        .iter()
                        .filter_map(|g| g["files"].as_array())
                        .flatten()
                        .filter_map(Value::as_str)
                    {
                        let file = file.split_once('=').map_or(file, |(_, p)| p);
                        assert!(
                            dir.join(file).exists(),
                            "{}: {file} is missing",
                            path.display()
                        );
                    }
                    let _ = (k.namespace, k.labels, k.images, k.secret_generator);
                }
                "Namespace" => drop(typed::<Namespace>(&doc, &path)),
                "ServiceAccount" => drop(typed::<ServiceAccount>(&doc, &path)),
                "ClusterRole" => m.roles.push(typed(&doc, &path)),
                "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(&doc, &path)),
                "ConfigMap" => m.config_maps.push((path.clone(), typed(&doc, &path))),
                "StatefulSet" => m.statefulsets.push(typed(&doc, &path)),
                "Service" => drop(typed::<Service>(&doc, &path)),
                "CronJob" => m.cronjobs.push(typed(&doc, &path)),
                "PrometheusRule" => m.rules.push(typed(&doc, &path)),
                "ServiceMonitor" => drop(typed::<ServiceMonitor>(&doc, &path)),
                "PodDisruptionBudget" => m.budgets.push((path.clone(), typed(&doc, &path))),
                "RabbitmqCluster" | "Cluster" => m.operated.push((path.clone(), doc.clone())),
                "NetworkPolicy" => drop(typed::<NetworkPolicy>(&doc, &path)),
                "Certificate" => m.certificates.push((path.clone(), doc.clone())),
                other => panic!("{}: no test knows kind {other:?}", path.display()),
            }
        }
    }
    m
}

/// The pod a CronJob's jobs run.
fn job_pod(cj: &CronJob) -> &k8s_openapi::api::core::v1::PodSpec {
    let job = cj
        .spec
        .as_ref()
        .unwrap()
        .job_template
        .spec
        .as_ref()
        .unwrap();
    job.template.spec.as_ref().unwrap()
}

#[test]
fn every_manifest_is_its_typed_object_and_the_workloads_are_locked_down() {
    let m = manifests();
    for kind in [
        "Kustomization",
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "StatefulSet",
        "Service",
        "CronJob",
        "PrometheusRule",
        "ServiceMonitor",
    ] {
        assert!(
            m.kinds.contains_key(kind),
            "no {kind} in deploy/: {:?}",
            m.kinds
        );
    }

    let role_names: BTreeSet<_> = m
        .roles
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    assert_eq!(
        role_names,
        BTreeSet::from(["rollgate".to_owned(), "rollgate-detect".to_owned()]),
        "serve and detect have roles of their own"
    );
    let sts = &m.statefulsets[0];
    let spec = sts.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1), "one serve per data dir");
    let pod = spec.template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(probe_path(&c.liveness_probe).as_deref(), Some("/healthz"));
    assert_eq!(probe_path(&c.readiness_probe).as_deref(), Some("/readyz"));
    assert!(c.resources.as_ref().unwrap().requests.is_some());
    assert!(c.resources.as_ref().unwrap().limits.is_some());
    assert!(
        spec.volume_claim_templates
            .as_ref()
            .is_some_and(|v| !v.is_empty()),
        "a volume for the embedded data"
    );
    // rollgate knows its own pod (the downward API), so a drain of its node evicts it last;
    // no toleration puts it on a control plane, and no budget blocks its own eviction.
    for (name, path) in [
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
    ] {
        let env = c.env.iter().flatten().find(|e| e.name == name);
        let field = env
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(field, Some(path), "{name}");
    }
    assert!(
        pod.tolerations.is_none(),
        "rollgate stays off the control planes"
    );
    // One replica: no budget may block its own eviction. Several (overlays/ha): one at a
    // time.
    for (path, pdb) in &m.budgets {
        assert!(
            path.starts_with(root().join("deploy/overlays/ha")),
            "{}",
            path.display()
        );
        let spec = pdb.spec.as_ref().unwrap();
        assert_eq!(
            spec.max_unavailable,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
        );
    }
    for (pod, containers) in [(pod, &pod.containers)]
        .into_iter()
        .chain(m.cronjobs.iter().map(|cj| {
            let pod = job_pod(cj);
            (pod, &pod.containers)
        }))
    {
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert!(psc.run_as_user.is_some_and(|u| u != 0));
        for c in containers {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop,
                Some(vec!["ALL".to_owned()])
            );
        }
        // Secrets are files: a secret volume, never environment values.
        let secret_volumes: BTreeSet<String> = pod
            .volumes
            .iter()
            .flatten()
            .filter(|v| v.secret.is_some())
            .map(|v| v.name.clone())
            .collect();
        assert!(!secret_volumes.is_empty());
        for c in containers {
            for env in c.env.iter().flatten() {
                // The downward API (who the pod is) is allowed; secrets never.
                let from_secret = env
                    .value_from
                    .as_ref()
                    .is_some_and(|v| v.secret_key_ref.is_some() || v.config_map_key_ref.is_some());
                assert!(!from_secret, "{}: secrets come as files", env.name);
            }
            assert!(
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|vm| secret_volumes.contains(&vm.name) && vm.read_only == Some(true))
            );
        }
    }

    let cron = m.cronjobs[0].spec.as_ref().unwrap();
    assert_eq!(cron.schedule, "0 6 * * *", "daily 06:00");
    assert_eq!(cron.time_zone.as_deref(), Some("Etc/UTC"));
    assert_eq!(cron.concurrency_policy.as_deref(), Some("Forbid"));
    let args = job_pod(&m.cronjobs[0]).containers[0].args.clone().unwrap();
    // Sentinels daily, the upgrade check weekly (the reference pipeline's cadence).
    assert_eq!(args, ["detect", "--reboots", "--upgrades-on", "sun"]);
}

fn api_use() -> BTreeSet<(String, String, String)> {
    rollgate::adapters::kube::API_USE
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_role_grants_every_api_use_of_the_adapters_and_nothing_more() {
    use rollgate::adapters::kube::{Kube, KubeSettings, Source};
    use rollgate::ports::{
        ClusterEvent, ClusterRead, DrainOptions, EventRecorder, ForeignLock, InFlight,
        InFlightMarks, NodeDrain, Regarding, StatefulSets,
    };
    let api = FakeKube::start().await;
    api.add_namespace("k8s-upgrade");
    api.add_node("cp", true, "1.34.2", "1.7.20");
    api.add_node("w1", false, "1.34.2", "1.7.20");
    api.add_pods("w1", "web", 2, false);
    api.set_pdb("web", "web", 0);
    api.add_statefulset("etcd", 3, 3, "rev-1", "rev-2");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let kube = Arc::new(
        Kube::new(KubeSettings {
            source: Source::Kubeconfig {
                path: kubeconfig,
                context: None,
            },
            namespace: "k8s-upgrade".into(),
            annotation_prefix: "rollgate.io".into(),
            request_timeout: Duration::from_secs(5),
        })
        .await
        .unwrap(),
    );
    // Every call the adapter offers, as the upgrade and the etcd roll make them.
    kube.facts().await.unwrap();
    kube.pod_readiness().await.unwrap();
    kube.static_pods("cp").await.unwrap();
    kube.cordon("w1", "run-1").await.unwrap();
    kube.drain(
        "w1",
        &DrainOptions {
            timeout: Duration::from_secs(20),
            retry_every: Duration::from_millis(200),
            grace_period: None,
            own_pod: None,
        },
    )
    .await
    .unwrap();
    kube.uncordon("w1", "run-1").await.unwrap();
    kube.cordon_holder("w1", "run-1").await.unwrap();
    kube.drain_facts("w1").await.unwrap();
    kube.set_in_flight(Some(&InFlight {
        run_id: "run-1".into(),
        target: "1.34.5".into(),
        snapshot_path: None,
    }))
    .await
    .unwrap();
    kube.set_in_flight(None).await.unwrap();
    let kured = kube.kured_lock("kube-system", "kured", "weave.works/kured-node-lock");
    api.add_kured(None);
    assert_eq!(kured.take().await.unwrap(), None);
    kured.release().await.unwrap();
    for regarding in [
        Regarding::Node("w1".into()),
        Regarding::Namespace("k8s-upgrade".into()),
    ] {
        kube.record(&ClusterEvent {
            regarding,
            reason: "Cordoned".into(),
            action: "Cordon".into(),
            note: "n".repeat(2000),
            warning: false,
        })
        .await
        .unwrap();
    }
    let before = kube.statefulset("default", "etcd").await.unwrap();
    kube.set_partition("default", "etcd", 2).await.unwrap();
    kube.pod_state("default", "etcd-2").await.unwrap();
    // The partition moved on since `before`: the watch returns at once.
    kube.wait_for_change(
        "default",
        "etcd",
        &before.resource_version,
        Duration::from_secs(5),
    )
    .await
    .unwrap();

    let used = api.access();
    let used_keys: BTreeSet<(String, String, String)> = used
        .iter()
        .map(|a| (a.group.clone(), a.resource.clone(), a.verb.clone()))
        .collect();
    assert_eq!(
        used_keys,
        api_use(),
        "adapters::kube::API_USE must list exactly what the adapter does"
    );
    let serve = cluster_role("rollgate");
    assert_granted(&serve, &used);
    let granted: BTreeSet<_> = grants(&serve).into_keys().collect();
    assert_eq!(
        granted,
        api_use(),
        "the role grants nothing rollgate does not use"
    );
    api.stop().await;
}

#[test]
fn the_prometheus_rule_carries_rules_exactly() {
    let m = manifests();
    assert_eq!(m.rules.len(), 1);
    let file: RuleFile = serde_norway::from_str(
        &std::fs::read_to_string(root().join("rules/upgrade-gates.yml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        m.rules[0].spec, file,
        "deploy/base/prometheusrule.yaml differs from rules/: run scripts/sync-prometheusrule.sh"
    );
}

/// The settings the `rollgate.toml` of config map `cm` (from `path`) loads to.
fn config_map_settings(path: &Path, cm: &ConfigMap) -> rollgate::config::Settings {
    let toml = &cm.data.as_ref().unwrap()["rollgate.toml"];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rollgate.toml");
    std::fs::write(&file, toml).unwrap();
    rollgate::config::Settings::load(Some(&file))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_configuration_in_every_config_map_loads() {
    let m = manifests();
    assert!(m.config_maps.len() >= 2, "base and the example overlay");
    for (path, cm) in &m.config_maps {
        let settings = config_map_settings(path, cm);
        assert_eq!(settings.cluster.namespace, "k8s-upgrade");
        // The namespace the marks go on is the one the role names.
        let names =
            &grants(&cluster_role("rollgate"))[&("".into(), "namespaces".into(), "patch".into())];
        assert!(names.contains(&settings.cluster.namespace), "{names:?}");
    }
}

/// The keys a secret generator of the example overlay puts in Secret `name`.
fn generated_keys(name: &str) -> BTreeSet<String> {
    example_secret_generators()
        .into_iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("the example overlay makes {name}"))["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().split('=').next().unwrap().to_owned())
        .collect()
}

/// Every file under `mount` a configuration names, relative to it.
fn files_under(toml: &str, mount: &str) -> BTreeSet<String> {
    toml.split('"')
        .filter_map(|s| s.strip_prefix(mount))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_secret_file_the_example_overlay_configures_is_in_its_secret() {
    let dir = root().join("deploy/overlays/example");
    let config = documents(&dir.join("site-config.yaml"))[0]["data"]["rollgate.toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let certificate = &documents(&dir.join("certificate.yaml"))[0];
    let tls_secret = certificate["spec"]["secretName"].as_str().unwrap();
    // The keys cert-manager writes into its Secret.
    let tls_keys: BTreeSet<String> = ["tls.crt", "tls.key", "ca.crt"].map(str::to_owned).into();
    for (mount, secret, keys) in [
        (
            "/var/run/secrets/rollgate/",
            "rollgate-secrets",
            generated_keys("rollgate-secrets"),
        ),
        (
            "/var/run/secrets/rollgate-clients/",
            "rollgate-clients",
            generated_keys("rollgate-clients"),
        ),
        ("/var/run/secrets/rollgate-tls/", tls_secret, tls_keys),
    ] {
        let used = files_under(&config, mount);
        assert!(!used.is_empty(), "nothing under {mount}");
        let missing: Vec<_> = used.difference(&keys).collect();
        assert!(
            missing.is_empty(),
            "configured but not in {secret}: {missing:?}"
        );
    }
    // Every client with scopes has its token file, and every token file its scopes.
    let settings = config_map_settings(
        &dir.join("site-config.yaml"),
        &typed(&documents(&dir.join("site-config.yaml"))[0], &dir),
    );
    let scoped: BTreeSet<String> = settings.server.scopes.keys().cloned().collect();
    assert_eq!(scoped, generated_keys("rollgate-clients"));
    assert!(
        settings.server.tokens_dir.is_some() && settings.server.tls_cert_file.is_some(),
        "the example site serves HTTPS with scoped tokens"
    );
    // No client may do everything, and the ones that feed rollgate may do only that.
    use rollgate::domain::scope::Scope;
    for (client, scopes) in &settings.server.scopes {
        assert!(
            scopes.len() < rollgate::workflows::scopes().len(),
            "{client} may do everything"
        );
    }
    assert_eq!(
        settings.server.scopes["alertmanager"],
        BTreeSet::from([Scope::ALERTS_WRITE])
    );
    assert_eq!(
        settings.server.scopes["detect"],
        BTreeSet::from([
            Scope::DETECTIONS_WRITE,
            rollgate::workflows::node_reboot::intake::DOOR.scope
        ])
    );
    assert_eq!(
        settings.detect.token_file,
        PathBuf::from("/var/run/secrets/rollgate-clients/detect")
    );
    assert!(settings.detect.rollgate_url.starts_with("https://"));
}

#[test]
fn the_alertmanager_example_is_valid_and_sends_the_token_as_a_bearer() {
    let path = root().join("deploy/examples/alertmanager-receiver.yaml");
    let doc = &documents(&path)[0];
    let hook = doc["receivers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "rollgate")
        .unwrap()["webhook_configs"][0]
        .clone();
    assert!(hook["url"].as_str().unwrap().ends_with("/v1/alerts"));
    assert_eq!(hook["send_resolved"], true);
    assert_eq!(hook["http_config"]["authorization"]["type"], "Bearer");
    let credentials = hook["http_config"]["authorization"]["credentials_file"]
        .as_str()
        .unwrap();
    // The token of the client that may only post alerts, over HTTPS trusting rollgate's CA.
    assert!(
        credentials.ends_with("/rollgate-clients/alertmanager"),
        "{credentials}"
    );
    assert!(hook["url"].as_str().unwrap().starts_with("https://"));
    let ca_file = hook["http_config"]["tls_config"]["ca_file"]
        .as_str()
        .unwrap();
    assert!(ca_file.ends_with("/rollgate-tls/ca.crt"), "{ca_file}");
    // The inhibition's source is a shipped rule without the gate label, matched by node.
    let inhibit = &doc["inhibit_rules"][0];
    assert_eq!(inhibit["equal"], serde_json::json!(["node"]), "{inhibit}");
    let source = inhibit["source_matchers"][0].as_str().unwrap_or_default();
    let rules = std::fs::read_to_string(root().join("rules/upgrade-gates.yml")).unwrap();
    let name = source
        .strip_prefix("alertname=\"")
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or_else(|| panic!("source matcher {source:?}"));
    let rule_at = rules
        .find(&format!("- alert: {name}\n"))
        .unwrap_or_else(|| panic!("no rule {name} in rules/"));
    assert!(
        rules[..rule_at].contains("- name: Rollgate"),
        "{name} is in the Rollgate group, never a gate"
    );
    // amtool (Debian's prometheus-alertmanager) accepts it once the token file exists.
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("api-token");
    std::fs::write(&token, "0123456789abcdef0123").unwrap();
    let ca = support::pki::TestCa::new("rollgate test CA").write(dir.path(), "ca.crt");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(credentials, token.to_str().unwrap())
        .replace(ca_file, ca.to_str().unwrap());
    let config = dir.path().join("alertmanager.yml");
    std::fs::write(&config, text).unwrap();
    let out = Command::new("amtool")
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("amtool runs (Debian package prometheus-alertmanager)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_image_builds_in_two_stages_and_runs_as_a_non_root_user() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let froms = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .count();
    assert!(froms >= 2, "multi-stage");
    let user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line");
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "{user}"
    );
    // The uid matches the manifests' runAsUser.
    assert!(user.starts_with("65532"));
}

/// The example overlay's generator of rollgate-secrets.
fn example_secret_generator() -> Value {
    example_secret_generators()
        .into_iter()
        .find(|g| g["name"] == "rollgate-secrets")
        .expect("rollgate-secrets")
}

/// The routes `rollgate detect` posts to with `args`: the upgrade it finds, and with
/// `--reboots` the nodes whose sentinel is set.
fn detect_routes(args: &[String]) -> Vec<&'static str> {
    let mut routes = vec!["/v1/detections"];
    if args.iter().any(|a| a == "--reboots") {
        routes.push("/v1/reboots");
    }
    routes
}

/// As an adopter deploys each overlay: the CronJob's client (the token file its
/// configuration names) holds every scope the routes its command posts to require, and no
/// more; every container finds the site's configuration through ROLLGATE_CONFIG, so
/// `kubectl exec … rollgate check-config` or `plan` reads what `serve` runs on.
#[test]
fn in_every_overlay_the_cronjob_may_do_what_its_command_asks_and_every_command_reads_the_site_config()
 {
    use rollgate::domain::scope::{Scope, required};
    for overlay in ["example", "ha", "fleet-downstream"] {
        let (dir, docs) = kustomize(overlay);
        let built = dir.path().join("built.yaml");
        let cm: ConfigMap = typed(
            docs.iter()
                .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "rollgate")
                .expect("the rollgate ConfigMap"),
            &built,
        );
        let settings = config_map_settings(&built, &cm);
        let cron: CronJob = typed(
            docs.iter()
                .find(|d| d["kind"] == "CronJob")
                .expect("the CronJob"),
            &built,
        );
        let container = &job_pod(&cron).containers[0];
        let args = container.args.clone().unwrap_or_default();
        let needed: BTreeSet<Scope> = detect_routes(&args)
            .into_iter()
            .map(|route| {
                required("POST", route, |p| rollgate::workflows::DOORS.scope_at(p))
                    .expect("a scope")
            })
            .collect();
        let dir_of_tokens = settings.server.tokens_dir.clone().expect("tokens_dir");
        let client = settings
            .detect
            .token_file
            .strip_prefix(&dir_of_tokens)
            .unwrap_or_else(|_| panic!("{overlay}: detect's token is not a client's"))
            .display()
            .to_string();
        assert_eq!(
            settings.server.scopes.get(&client),
            Some(&needed),
            "{overlay}: client {client} runs {args:?}"
        );

        let sts: StatefulSet = typed(
            docs.iter()
                .find(|d| d["kind"] == "StatefulSet" && d["metadata"]["name"] == "rollgate")
                .unwrap(),
            &built,
        );
        let pod = sts.spec.unwrap().template.spec.unwrap();
        for (what, c) in [("serve", &pod.containers[0]), ("detect", container)] {
            let config = c
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "ROLLGATE_CONFIG")
                .and_then(|e| e.value.clone())
                .unwrap_or_else(|| panic!("{overlay}: {what} has no ROLLGATE_CONFIG"));
            assert_eq!(config, "/etc/rollgate/rollgate.toml", "{overlay}: {what}");
            let mounted = c
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/etc/rollgate" && m.name == "config");
            assert!(
                mounted,
                "{overlay}: {what} mounts the ConfigMap at /etc/rollgate"
            );
            assert!(
                !c.args.iter().flatten().any(|a| a == "--config"),
                "{overlay}: {what} names its config in ROLLGATE_CONFIG alone"
            );
        }
    }
}

/// The fleet-downstream overlay builds into the example site whose configuration waits
/// for staging: the upstream's token and CA files are the keys of the rollgate-fleet Secret
/// where the pod mounts it, and the NetworkPolicy lets rollgate reach staging's port.
#[test]
fn the_fleet_downstream_overlay_asks_staging_with_the_mounted_secret_and_may_reach_it() {
    let (dir, docs) = kustomize("fleet-downstream");
    let built = dir.path().join("built.yaml");
    let of = |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
    let cm: ConfigMap = typed(
        of("ConfigMap")
            .into_iter()
            .find(|d| d["metadata"]["name"] == "rollgate")
            .expect("the rollgate config map"),
        &built,
    );
    let settings = config_map_settings(&built, &cm);
    assert_eq!(settings.workflows.fleet.name, "prod");
    assert!(settings.workflows.fleet.require_approval);
    let upstream = &settings.workflows.fleet.upstreams[0];
    assert_eq!(upstream.name, "staging");
    let url = reqwest::Url::parse(&upstream.url).unwrap();
    assert_eq!(url.scheme(), "https");

    let sts: StatefulSet = typed(of("StatefulSet")[0], &built);
    let pod = sts.spec.unwrap().template.spec.unwrap();
    let mount = pod.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == "fleet")
        .expect("the fleet volume is mounted");
    let volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "fleet")
        .unwrap();
    let secret_name = volume.secret.unwrap().secret_name.unwrap();
    let secret = of("Secret")
        .into_iter()
        .find(|d| d["metadata"]["name"] == secret_name.as_str())
        .expect("the fleet Secret is generated");
    for file in [&upstream.token_file, &upstream.ca_file] {
        let file = file.as_ref().expect("token and CA files are set");
        let key = file
            .strip_prefix(&mount.mount_path)
            .unwrap_or_else(|_| panic!("{} is not under {}", file.display(), mount.mount_path));
        assert!(
            secret["data"][key.to_str().unwrap()].is_string(),
            "{key:?} is not a key of {secret_name}"
        );
    }

    let policy: NetworkPolicy = typed(
        of("NetworkPolicy")
            .into_iter()
            .find(|d| d["metadata"]["name"] == "rollgate")
            .unwrap(),
        &built,
    );
    let port = url.port().unwrap_or(443);
    let reaches = policy.spec.unwrap().egress.unwrap().iter().any(|rule| {
        rule.ports.iter().flatten().any(|p| {
            p.port
                == Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(port)),
                )
        }) && rule.to.iter().flatten().any(|peer| peer.ip_block.is_some())
    });
    assert!(reaches, "no egress to the upstream's port {port}");
}

/// The HA overlay builds into three rollgate pods on three nodes, a budget of one, the
/// operators' RabbitMQ and PostgreSQL clusters of three, and a configuration on them whose
/// every secret file is projected from rollgate-secrets or the operators' Secrets.
#[test]
fn the_ha_overlay_builds_three_replicas_apart_on_the_operators_clusters() {
    let (dir, docs) = kustomize("ha");
    let built = dir.path().join("built.yaml");
    let of = |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
    let sts: StatefulSet = typed(of("StatefulSet")[0], &built);
    let spec = sts.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    let pod = spec.template.spec.unwrap();
    let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
    let terms = anti
        .required_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(terms[0].topology_key, "kubernetes.io/hostname");

    let pdb: PodDisruptionBudget = typed(of("PodDisruptionBudget")[0], &built);
    let selector = pdb.spec.unwrap().selector.unwrap().match_labels.unwrap();
    let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
    assert!(
        selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "the budget covers the pods"
    );

    let mq = of("RabbitmqCluster")[0];
    assert_eq!(mq["apiVersion"], "rabbitmq.com/v1beta1");
    assert_eq!(mq["spec"]["replicas"], 3);
    let db = of("Cluster")[0];
    assert_eq!(db["apiVersion"], "postgresql.cnpg.io/v1");
    assert_eq!(db["spec"]["instances"], 3);
    let (mq_name, db_name) = (
        mq["metadata"]["name"].as_str().unwrap(),
        db["metadata"]["name"].as_str().unwrap(),
    );
    let owner = db["spec"]["bootstrap"]["initdb"]["owner"].as_str().unwrap();
    let database = db["spec"]["bootstrap"]["initdb"]["database"]
        .as_str()
        .unwrap();

    let cm = of("ConfigMap")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "rollgate")
        .unwrap();
    let cm: ConfigMap = typed(cm, &built);
    let settings = config_map_settings(&built, &cm);
    assert_eq!(settings.queue.backend, rollgate::config::QueueBackend::Amqp);
    assert!(
        settings
            .queue
            .amqp_url
            .contains(&format!("{mq_name}.rollgate.svc:5672"))
    );
    assert_eq!(
        settings.store.backend,
        rollgate::config::StoreBackend::Postgres
    );
    assert_eq!(
        settings.store.url.as_deref(),
        Some(format!("postgres://{owner}@{db_name}-rw.rollgate.svc:5432/{database}").as_str())
    );

    // Every secret file the configuration names is projected into the secrets volume,
    // from the Secret that holds it.
    let volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "secrets")
        .unwrap();
    let sources = volume.projected.unwrap().sources.unwrap();
    let mut projected = BTreeMap::new();
    for source in sources {
        let secret = source.secret.unwrap();
        match secret.items {
            Some(items) => {
                for i in items {
                    projected.insert(i.path, (secret.name.clone(), i.key));
                }
            }
            None => {
                for file in example_secret_generator()["files"].as_array().unwrap() {
                    let key = file.as_str().unwrap().split('=').next().unwrap().to_owned();
                    projected.insert(key.clone(), (secret.name.clone(), key));
                }
            }
        }
    }
    let mount = std::path::Path::new("/var/run/secrets/rollgate");
    let file = |p: &Option<PathBuf>| {
        p.as_ref()
            .unwrap()
            .strip_prefix(mount)
            .unwrap()
            .display()
            .to_string()
    };
    assert_eq!(
        projected[&file(&settings.queue.amqp_credentials_file)],
        (
            format!("{mq_name}-default-user"),
            "default_user.conf".to_owned()
        )
    );
    assert_eq!(
        projected[&file(&settings.store.password_file)],
        (format!("{db_name}-app"), "password".to_owned())
    );
    let toml = &cm.data.as_ref().unwrap()["rollgate.toml"];
    for used in toml
        .split('"')
        .filter_map(|s| s.strip_prefix("/var/run/secrets/rollgate/"))
    {
        assert!(
            projected.contains_key(used),
            "{used} is not in the secrets volume"
        );
    }
    // The operator's file parses as the broker's credentials.
    assert_eq!(
        rollgate::queue::amqp::parse_credentials(
            "default_user = default_user_a\ndefault_pass = b\n"
        ),
        Some(("default_user_a".to_owned(), "b".to_owned()))
    );
}

/// `kubectl kustomize` (kustomize v5 built in) builds the example overlay, given the secret
/// files it expects, into objects of their types: the image pinned, every namespaced
/// object in `rollgate`, the site's configuration patched over the base's. Needs kubectl,
/// which Debian does not package in a version with kustomize v5; without it the test says
/// so and checks nothing else than the other tests do.
#[test]
fn the_example_overlay_builds_with_kustomize() {
    let (dir, docs) = kustomize("example");
    let built = dir.path().join("built.yaml");

    let mut kinds = BTreeMap::<String, usize>::new();
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap().to_owned();
        *kinds.entry(kind.clone()).or_default() += 1;
        let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"];
        if !cluster_scoped.contains(&kind.as_str()) {
            assert_eq!(
                doc["metadata"]["namespace"], "rollgate",
                "{kind} {}",
                doc["metadata"]["name"]
            );
        }
        assert_eq!(
            doc["metadata"]["labels"]["app.kubernetes.io/part-of"], "rollgate",
            "{kind} {}",
            doc["metadata"]["name"]
        );
        match kind.as_str() {
            "StatefulSet" => {
                let sts: StatefulSet = typed(doc, &built);
                let pod = sts.spec.unwrap().template.spec.unwrap();
                let c = &pod.containers[0];
                assert_eq!(c.image.as_deref(), Some("ghcr.io/rollgate/rollgate:0.1.0"));
                for probe in [&c.readiness_probe, &c.liveness_probe] {
                    let scheme = probe
                        .as_ref()
                        .and_then(|p| p.http_get.as_ref()?.scheme.clone());
                    assert_eq!(scheme.as_deref(), Some("HTTPS"), "probes over HTTPS");
                }
                // Rotated tokens and renewed certificates appear in place only in a whole
                // Secret volume: no items, no subPath.
                for (volume, secret) in [("clients", "rollgate-clients"), ("tls", "rollgate-tls")] {
                    let v = pod
                        .volumes
                        .iter()
                        .flatten()
                        .find(|v| v.name == volume)
                        .unwrap();
                    let source = v.secret.as_ref().unwrap();
                    assert_eq!(source.secret_name.as_deref(), Some(secret));
                    assert!(source.items.is_none(), "{volume}: items freeze the files");
                    let mount = c
                        .volume_mounts
                        .iter()
                        .flatten()
                        .find(|m| m.name == volume)
                        .unwrap();
                    assert!(
                        mount.sub_path.is_none(),
                        "{volume}: subPath freezes the files"
                    );
                }
            }
            "CronJob" => {
                let cj: CronJob = typed(doc, &built);
                assert_eq!(
                    job_pod(&cj).containers[0].image.as_deref(),
                    Some("ghcr.io/rollgate/rollgate:0.1.0")
                );
            }
            "ConfigMap" if doc["metadata"]["name"] == "rollgate-dashboard" => {
                let cm: ConfigMap = typed(doc, &built);
                let labels = cm.metadata.labels.unwrap_or_default();
                assert_eq!(
                    labels.get("grafana_dashboard").map(String::as_str),
                    Some("1")
                );
                let json = &cm.data.unwrap()["rollgate.json"];
                let dashboard: Value = serde_json::from_str(json).expect("the dashboard is JSON");
                assert_eq!(dashboard["uid"], "rollgate");
            }
            "ConfigMap" => {
                let cm: ConfigMap = typed(doc, &built);
                let toml = &cm.data.unwrap()["rollgate.toml"];
                assert!(toml.contains("k8s-node4"), "the site's patch won: {toml}");
            }
            "Secret" => {
                let secret: k8s_openapi::api::core::v1::Secret = typed(doc, &built);
                let name = secret.metadata.name.clone().unwrap_or_default();
                let keys: BTreeSet<String> = secret.data.unwrap().into_keys().collect();
                assert_eq!(keys, generated_keys(&name), "{name}");
            }
            "NetworkPolicy" => drop(typed::<NetworkPolicy>(doc, &built)),
            "Certificate" => {
                assert_eq!(doc["apiVersion"], "cert-manager.io/v1");
                assert_eq!(doc["spec"]["secretName"], "rollgate-tls");
                let names: Vec<&str> = doc["spec"]["dnsNames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                // The name the clients use is on the certificate.
                assert!(names.contains(&"rollgate.rollgate.svc"), "{names:?}");
            }
            "Namespace" => drop(typed::<Namespace>(doc, &built)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(doc, &built)),
            "ClusterRole" => drop(typed::<ClusterRole>(doc, &built)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(doc, &built)),
            "Service" => drop(typed::<Service>(doc, &built)),
            "PrometheusRule" => drop(typed::<PrometheusRule>(doc, &built)),
            "ServiceMonitor" => {
                let monitor: ServiceMonitor = typed(doc, &built);
                let endpoint = &monitor.spec.endpoints[0];
                assert_eq!(endpoint.scheme.as_deref(), Some("https"));
                let tls = endpoint.tls_config.as_ref().expect("tlsConfig");
                assert_eq!(tls.ca.secret.name, "rollgate-tls");
                assert_eq!(tls.ca.secret.key, "ca.crt");
            }
            other => panic!("kustomize built a {other} no test knows"),
        }
    }
    assert_eq!(
        kinds.get("ConfigMap"),
        Some(&2),
        "the patch merged (rollgate's and the dashboard's): {kinds:?}"
    );
    assert_eq!(kinds.get("Secret"), Some(&2), "{kinds:?}");
    assert_eq!(kinds.get("NetworkPolicy"), Some(&2), "{kinds:?}");
    assert_eq!(kinds.values().sum::<usize>(), 20, "{kinds:?}");
    let namespaces: BTreeSet<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "Namespace")
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["k8s-upgrade", "rollgate"]));
}

#[test]
fn every_namespace_named_exists() {
    let m = manifests();
    let mut named = BTreeSet::new();
    for path in yaml_files(&root().join("deploy/base")) {
        for doc in documents(&path) {
            if let Some(ns) = doc["metadata"]["namespace"].as_str() {
                named.insert(ns.to_owned());
            }
        }
    }
    for (path, cm) in &m.config_maps {
        let settings = config_map_settings(path, cm);
        named.insert(settings.cluster.namespace);
    }
    let granted =
        &grants(&cluster_role("rollgate"))[&("".into(), "namespaces".into(), "patch".into())];
    named.extend(granted.iter().cloned());
    let existing: BTreeSet<String> = yaml_files(&root().join("deploy/base"))
        .iter()
        .flat_map(|p| documents(p))
        .filter(|d| d["kind"] == "Namespace")
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let missing: Vec<&String> = named.difference(&existing).collect();
    assert!(
        missing.is_empty(),
        "named but never created: {missing:?} (created: {existing:?})"
    );
}

/// Whether the kubelet's projection of one secret file lets the container's user read it:
/// files are owned by root; with an fsGroup their group is it and the group read bit is
/// added (read-only volume); the mode is the item's, else the volume's defaultMode, else 0644.
fn secret_file_readable(
    pod: &k8s_openapi::api::core::v1::PodSpec,
    mode: i32,
    user: i64,
    group: i64,
) -> bool {
    let psc = pod.security_context.clone().unwrap_or_default();
    let fs_group = psc.fs_group;
    let (owner_group, mode) = match fs_group {
        Some(g) => (g, mode | 0o440),
        None => (0, mode),
    };
    let mut groups: BTreeSet<i64> = psc
        .supplemental_groups
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    groups.insert(group);
    groups.extend(fs_group);
    (user == 0 && mode & 0o400 != 0)
        || (groups.contains(&owner_group) && mode & 0o040 != 0)
        || mode & 0o004 != 0
}

#[test]
fn every_mounted_secret_file_is_readable_by_its_container() {
    let m = manifests();
    let pods = m
        .statefulsets
        .iter()
        .map(|s| s.spec.as_ref().unwrap().template.spec.as_ref().unwrap())
        .chain(m.cronjobs.iter().map(job_pod));
    let mut checked = 0;
    for pod in pods {
        let psc = pod.security_context.clone().unwrap_or_default();
        for c in &pod.containers {
            let sc = c.security_context.clone().unwrap_or_default();
            let user = sc.run_as_user.or(psc.run_as_user).unwrap_or(0);
            let group = sc.run_as_group.or(psc.run_as_group).unwrap_or(0);
            for mount in c.volume_mounts.iter().flatten() {
                // A claim template's volume is not in the pod's list, and is no secret.
                let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name);
                let Some(secret) = volume.and_then(|v| v.secret.as_ref()) else {
                    continue;
                };
                let default = secret.default_mode.unwrap_or(0o644);
                let files: Vec<(String, i32)> = match &secret.items {
                    Some(items) => items
                        .iter()
                        .map(|i| (i.path.clone(), i.mode.unwrap_or(default)))
                        .collect(),
                    None => vec![("(every key)".into(), default)],
                };
                for (file, mode) in files {
                    checked += 1;
                    assert!(
                        secret_file_readable(pod, mode, user, group),
                        "{}: {}/{file} (mode {mode:o}) is not readable by uid {user} gid {group}",
                        c.name,
                        mount.mount_path
                    );
                }
            }
        }
    }
    assert!(checked >= 2, "the secrets of serve and detect were checked");
}

/// GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to
/// hyphens.
/// Where a connection goes, as a NetworkPolicy sees it.
#[derive(Debug, Clone)]
enum Peer {
    /// An address outside the pod network.
    Ip(std::net::Ipv4Addr),
    /// Pods of `namespace` labelled `labels`.
    Pods {
        namespace: String,
        labels: BTreeMap<String, String>,
    },
}

/// Pods of the site's Services, by host name: kube-prometheus' and the operators' labels.
fn service_pods(host: &str) -> Peer {
    let (namespace, label, value) = match host {
        "prometheus-operated.monitoring.svc" => {
            ("monitoring", "app.kubernetes.io/name", "prometheus")
        }
        "alertmanager-operated.monitoring.svc" => {
            ("monitoring", "app.kubernetes.io/name", "alertmanager")
        }
        "prometheus-pushgateway.monitoring.svc" => (
            "monitoring",
            "app.kubernetes.io/name",
            "prometheus-pushgateway",
        ),
        "rollgate-mq.rollgate.svc" => ("rollgate", "app.kubernetes.io/name", "rollgate-mq"),
        "rollgate-db-rw.rollgate.svc" => ("rollgate", "cnpg.io/cluster", "rollgate-db"),
        "rollgate.rollgate.svc" => ("rollgate", "app.kubernetes.io/name", "rollgate"),
        "kube-dns" => ("kube-system", "k8s-app", "kube-dns"),
        other => match other.parse() {
            Ok(ip) => return Peer::Ip(ip),
            Err(_) => panic!("no pods known for {other}: add them to service_pods"),
        },
    };
    Peer::Pods {
        namespace: namespace.into(),
        labels: BTreeMap::from([(label.into(), value.into())]),
    }
}

fn selects(
    selector: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    match selector {
        None => true,
        Some(s) => {
            assert!(s.match_expressions.is_none(), "only matchLabels here");
            s.match_labels
                .iter()
                .flatten()
                .all(|(k, v)| labels.get(k) == Some(v))
        }
    }
}

fn in_block(block: &k8s_openapi::api::networking::v1::IPBlock, ip: std::net::Ipv4Addr) -> bool {
    let contains = |cidr: &str| {
        let (net, bits) = cidr.split_once('/').expect("a CIDR");
        let net: std::net::Ipv4Addr = net.parse().expect("IPv4");
        let bits: u32 = bits.parse().expect("prefix");
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        u32::from(ip) & mask == u32::from(net) & mask
    };
    contains(&block.cidr) && !block.except.iter().flatten().any(|e| contains(e))
}

/// Whether `peer` matches one NetworkPolicy peer of a policy in `own` namespace.
fn matches(
    peer: &Peer,
    rule: &k8s_openapi::api::networking::v1::NetworkPolicyPeer,
    own: &str,
) -> bool {
    match peer {
        Peer::Ip(ip) => rule.ip_block.as_ref().is_some_and(|b| in_block(b, *ip)),
        Peer::Pods { namespace, labels } => {
            if rule.ip_block.is_some() {
                return false;
            }
            let namespace_ok = match &rule.namespace_selector {
                None => namespace == own,
                Some(_) => selects(
                    &rule.namespace_selector,
                    &BTreeMap::from([(
                        "kubernetes.io/metadata.name".to_owned(),
                        namespace.clone(),
                    )]),
                ),
            };
            namespace_ok && selects(&rule.pod_selector, labels)
        }
    }
}

/// The egress rules of `policy` that let a connection to `peer` on `port`/`protocol` out.
fn egress_to(policy: &NetworkPolicy, peer: &Peer, port: u16, protocol: &str) -> Vec<usize> {
    let spec = policy.spec.as_ref().unwrap();
    let own = policy.metadata.namespace.as_deref().unwrap();
    spec.egress
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, rule)| {
            let port_ok = rule.ports.iter().flatten().any(|p| {
                p.protocol.as_deref().unwrap_or("TCP") == protocol
                    && p.port
                        == Some(
                            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                                i32::from(port),
                            ),
                        )
            });
            port_ok && rule.to.iter().flatten().any(|to| matches(peer, to, own))
        })
        .map(|(i, _)| i)
        .collect()
}

/// host and port of a URL.
fn host_port(url: &str) -> (String, u16) {
    let url = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    (
        url.host_str().unwrap().to_owned(),
        url.port_or_known_default().unwrap(),
    )
}

/// What every pod of rollgate's talks to: the cluster's DNS and the API server (on the
/// control planes).
fn cluster_basics(control_plane: &Peer) -> Vec<(String, Peer, u16, &'static str)> {
    vec![
        ("DNS".to_owned(), service_pods("kube-dns"), 53, "UDP"),
        (
            "DNS over TCP".to_owned(),
            service_pods("kube-dns"),
            53,
            "TCP",
        ),
        (
            "the API server".to_owned(),
            control_plane.clone(),
            6443,
            "TCP",
        ),
    ]
}

/// Checks that `policy` lets out exactly `needed` (every egress rule used by one of them;
/// every rule bounded by ports and peers).
fn lets_out_exactly(policy: &NetworkPolicy, needed: &[(String, Peer, u16, &str)]) {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let rules = policy
        .spec
        .as_ref()
        .unwrap()
        .egress
        .clone()
        .unwrap_or_default();
    let mut used = BTreeSet::new();
    for (what, peer, port, protocol) in needed {
        let by = egress_to(policy, peer, *port, protocol);
        assert!(
            !by.is_empty(),
            "{name}: nothing lets {what} out ({peer:?}:{port}/{protocol})"
        );
        used.extend(by);
    }
    for (i, rule) in rules.iter().enumerate() {
        assert!(
            rule.ports.as_ref().is_some_and(|p| !p.is_empty())
                && rule.to.as_ref().is_some_and(|t| !t.is_empty()),
            "{name}: egress rule {i} is not bounded by ports and peers"
        );
        assert!(
            used.contains(&i),
            "{name}: egress rule {i} serves nothing rollgate talks to: {rule:?}"
        );
    }
}

/// The example and HA overlays' NetworkPolicies: rollgate's port open to Alertmanager,
/// Prometheus, the detection CronJob and the operators' namespace only; rollgate let out
/// to exactly what its configuration names (the API server, Prometheus, Alertmanager,
/// etcd, the nodes' SSH, Slack, and for HA its RabbitMQ and PostgreSQL), the detection to
/// what it talks to.
#[test]
fn the_network_policies_let_in_only_rollgates_clients_and_out_only_what_it_is_configured_to_reach()
{
    for overlay in ["example", "ha"] {
        let (dir, docs) = kustomize(overlay);
        let built = dir.path().join("built.yaml");
        let policy = |name: &str| -> NetworkPolicy {
            let doc = docs
                .iter()
                .find(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{overlay}: no NetworkPolicy {name}"));
            typed(doc, &built)
        };
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "rollgate")
            .unwrap();
        let settings = config_map_settings(&built, &typed(cm, &built));
        let pod_labels = |kind: &str| -> BTreeMap<String, String> {
            let doc = docs.iter().find(|d| d["kind"] == kind).unwrap();
            let template = match kind {
                "StatefulSet" => &doc["spec"]["template"],
                _ => &doc["spec"]["jobTemplate"]["spec"]["template"],
            };
            serde_json::from_value(template["metadata"]["labels"].clone()).unwrap()
        };
        let serve = policy("rollgate");
        let spec = serve.spec.clone().unwrap();
        assert!(selects(&spec.pod_selector, &pod_labels("StatefulSet")));
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_owned(), "Egress".to_owned()])
        );

        // In: exactly these clients, on rollgate's port only.
        let port = i32::from(settings.server.listen.port());
        let ingress = spec.ingress.clone().unwrap();
        for rule in &ingress {
            let ports: Vec<_> = rule
                .ports
                .iter()
                .flatten()
                .map(|p| p.port.clone())
                .collect();
            assert_eq!(
                ports,
                vec![Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port)
                )],
                "{overlay}: ingress only to the API port"
            );
        }
        let peers: Vec<_> = ingress
            .iter()
            .flat_map(|r| r.from.clone().unwrap_or_default())
            .collect();
        let admitted = |peer: &Peer| peers.iter().any(|p| matches(peer, p, "rollgate"));
        let pods = |namespace: &str, name: &str| Peer::Pods {
            namespace: namespace.into(),
            labels: BTreeMap::from([("app.kubernetes.io/name".into(), name.into())]),
        };
        for (who, peer) in [
            ("Alertmanager", pods("monitoring", "alertmanager")),
            ("Prometheus", pods("monitoring", "prometheus")),
            (
                "the detection",
                Peer::Pods {
                    namespace: "rollgate".into(),
                    labels: pod_labels("CronJob"),
                },
            ),
            ("an operator", pods("operators", "anything")),
        ] {
            assert!(admitted(&peer), "{overlay}: {who} cannot reach rollgate");
        }
        for (who, peer) in [
            ("Grafana", pods("monitoring", "grafana")),
            ("a workload", pods("default", "shop")),
            (
                "rollgate's own namespace at large",
                pods("rollgate", "anything"),
            ),
            ("the node network", Peer::Ip("10.0.20.7".parse().unwrap())),
        ] {
            assert!(!admitted(&peer), "{overlay}: {who} may reach rollgate");
        }

        // Out: what the configuration names, and nothing else.
        let etcd_host = host_port(&settings.etcd.endpoints[0]);
        let control_plane = service_pods(&etcd_host.0);
        let mut needed = cluster_basics(&control_plane);
        needed.extend([
            (
                "the control plane's etcd".to_owned(),
                control_plane.clone(),
                etcd_host.1,
                "TCP",
            ),
            (
                "SSH to the nodes".to_owned(),
                control_plane.clone(),
                settings.ssh.port,
                "TCP",
            ),
            (
                "Slack".to_owned(),
                Peer::Ip("34.226.1.10".parse().unwrap()),
                443,
                "TCP",
            ),
            (
                "an etcd StatefulSet's members".to_owned(),
                Peer::Pods {
                    namespace: "keyspace".into(),
                    labels: BTreeMap::from([("app.kubernetes.io/name".into(), "etcd".into())]),
                },
                2379,
                "TCP",
            ),
        ]);
        let mut urls = vec![("gate.prometheus_url", settings.gate.prometheus_url.clone())];
        urls.push((
            "gate.alertmanager_url",
            settings.gate.alertmanager_url.clone(),
        ));
        if settings.queue.backend == rollgate::config::QueueBackend::Amqp {
            urls.push(("queue.amqp_url", Some(settings.queue.amqp_url.clone())));
        }
        urls.push(("store.url", settings.store.url.clone()));
        for (key, url) in urls {
            if let Some(url) = url {
                let (host, port) = host_port(&url);
                needed.push((key.to_owned(), service_pods(&host), port, "TCP"));
            }
        }
        lets_out_exactly(&serve, &needed);
        assert!(
            egress_to(&serve, &pods("default", "shop"), 8080, "TCP").is_empty(),
            "{overlay}: rollgate may reach any pod"
        );

        // The detection: its facts, its releases, its metrics and rollgate.
        let detect = policy("rollgate-detect");
        let dspec = detect.spec.clone().unwrap();
        assert!(selects(&dspec.pod_selector, &pod_labels("CronJob")));
        assert_eq!(
            dspec.ingress.as_ref().map(Vec::len),
            Some(0),
            "nothing calls the detection"
        );
        let (rg_host, rg_port) = host_port(&settings.detect.rollgate_url);
        let (pg_host, pg_port) = host_port(settings.detect.pushgateway_url.as_deref().unwrap());
        let (_, repo_port) = host_port(&settings.detect.repo_url);
        lets_out_exactly(
            &detect,
            &[
                cluster_basics(&control_plane),
                vec![
                    (
                        "SSH to the nodes".to_owned(),
                        control_plane.clone(),
                        settings.ssh.port,
                        "TCP",
                    ),
                    (
                        "detect.rollgate_url".to_owned(),
                        service_pods(&rg_host),
                        rg_port,
                        "TCP",
                    ),
                    (
                        "detect.pushgateway_url".to_owned(),
                        service_pods(&pg_host),
                        pg_port,
                        "TCP",
                    ),
                    (
                        "detect.repo_url".to_owned(),
                        Peer::Ip("151.101.1.1".parse().unwrap()),
                        repo_port,
                        "TCP",
                    ),
                ],
            ]
            .concat(),
        );
        // rollgate admits the detection on the port it posts to.
        assert_eq!(i32::from(rg_port), port);
    }
}
