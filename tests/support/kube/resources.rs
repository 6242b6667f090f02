//! The resources the fake serves, as discovery describes them, and how a request path
//! names one.

use serde_json::{Value, json};

/// One served resource type.
#[derive(Debug)]
pub struct Resource {
    /// API group, "" for core.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short: &'static [&'static str],
    /// Whether `status` is a subresource (writes to the main resource keep the status).
    pub status: bool,
    /// Whether a change of `spec` moves `metadata.generation` on.
    pub generation: bool,
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Every resource the fake serves.
pub const RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short: &["no"],
        status: true,
        generation: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short: &["ns"],
        status: true,
        generation: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short: &["po"],
        status: true,
        generation: false,
    },
    Resource {
        group: "apps",
        version: "v1",
        plural: "statefulsets",
        singular: "statefulset",
        kind: "StatefulSet",
        namespaced: true,
        short: &["sts"],
        status: true,
        generation: true,
    },
    Resource {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        short: &["ds"],
        status: true,
        generation: true,
    },
    Resource {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        singular: "replicaset",
        kind: "ReplicaSet",
        namespaced: true,
        short: &["rs"],
        status: true,
        generation: true,
    },
    Resource {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        namespaced: true,
        short: &["pdb"],
        status: true,
        generation: true,
    },
    Resource {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short: &["ev"],
        status: false,
        generation: false,
    },
];

impl Resource {
    /// The served resource `plural` of group `group`.
    pub fn find(group: &str, plural: &str) -> Option<&'static Resource> {
        RESOURCES
            .iter()
            .find(|r| r.group == group && r.plural == plural)
    }

    /// The resource by its plural alone (names are unique across the fake's groups).
    pub fn named(plural: &str) -> &'static Resource {
        RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap_or_else(|| panic!("the fake serves no {plural}"))
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods`, `statefulsets.apps`: how Status messages name the resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// What a request path names.
#[derive(Debug)]
pub enum Target {
    /// `/api`, `/apis`, `/api/v1`, `/apis/G`, `/apis/G/V`: discovery documents.
    Discovery(Value),
    /// A collection or an object of a served resource.
    Object {
        resource: &'static Resource,
        namespace: Option<String>,
        name: Option<String>,
        subresource: Option<String>,
    },
    /// A path under `/api` or `/apis` that names nothing served.
    Unknown,
}

fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&str> = RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    groups
}

fn group_document(group: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// The APIResourceList of `group`/`version`, with the subresources kubectl looks for
/// (`pods/eviction` names the policy group, as kubectl drain's support check wants).
fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": VERBS, "shortNames": r.short,
        }));
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if r.plural == "pods" {
            resources.push(json!({
                "name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

/// What `path` names.
pub fn route(path: &str) -> Target {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api"] => {
            return Target::Discovery(json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
            }));
        }
        ["apis"] => {
            let groups: Vec<Value> = groups().into_iter().map(group_document).collect();
            return Target::Discovery(
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            );
        }
        ["apis", group] if groups().contains(group) => {
            let mut doc = group_document(group);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            return Target::Discovery(doc);
        }
        ["api", "v1"] => return Target::Discovery(resource_list("", "v1")),
        ["apis", group, "v1"] if groups().contains(group) => {
            return Target::Discovery(resource_list(group, "v1"));
        }
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (*group, rest),
        _ => return Target::Unknown,
    };
    let namespaced_tail = match rest {
        ["namespaces", ns, resource, tail @ ..]
            if Resource::find(group, resource).is_some_and(|r| r.namespaced) =>
        {
            Some((Some((*ns).to_owned()), *resource, tail))
        }
        _ => None,
    };
    let (namespace, plural, tail) = match namespaced_tail {
        Some(found) => found,
        None => match rest {
            [resource, tail @ ..] => (None, *resource, tail),
            [] => return Target::Unknown,
        },
    };
    let Some(resource) = Resource::find(group, plural) else {
        return Target::Unknown;
    };
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some((*name).to_owned()), None),
        [name, sub] => (Some((*name).to_owned()), Some((*sub).to_owned())),
        _ => return Target::Unknown,
    };
    if resource.namespaced && name.is_some() && namespace.is_none() {
        return Target::Unknown;
    }
    Target::Object {
        resource,
        namespace,
        name,
        subresource,
    }
}
