//! Server-side printing: the `Table` (meta.k8s.io/v1) that `kubectl get` asks for, with
//! the columns the real API server prints for nodes, pods, StatefulSets and budgets, and
//! Name and Age for the rest.

use super::resources::Resource;
use serde_json::{Value, json};

/// Whether the client asked for a Table (`Accept: …;as=Table;…`).
pub fn wanted(accept: &str) -> bool {
    accept.contains("as=Table")
}

fn age(object: &Value) -> String {
    let Some(created) = object["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    else {
        return "<unknown>".to_owned();
    };
    let secs = (chrono::Utc::now() - created.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn column(name: &str, format: &str) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": "", "priority": 0})
}

fn ready_condition(object: &Value) -> Option<&str> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
}

fn columns(resource: &Resource) -> Vec<Value> {
    let names: &[&str] = match resource.plural {
        "nodes" => &["Name", "Status", "Roles", "Age", "Version"],
        "pods" => &["Name", "Ready", "Status", "Restarts", "Age"],
        "statefulsets" => &["Name", "Ready", "Age"],
        "poddisruptionbudgets" => &[
            "Name",
            "Min Available",
            "Max Unavailable",
            "Allowed Disruptions",
            "Age",
        ],
        _ => &["Name", "Age"],
    };
    names
        .iter()
        .map(|n| column(n, if *n == "Name" { "name" } else { "" }))
        .collect()
}

fn or_na(value: &Value) -> String {
    match value {
        Value::Null => "N/A".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn cells(resource: &Resource, o: &Value) -> Vec<Value> {
    let name = json!(o["metadata"]["name"]);
    let age = json!(age(o));
    match resource.plural {
        "nodes" => {
            let mut status = match ready_condition(o) {
                Some("True") => "Ready".to_owned(),
                Some("False") => "NotReady".to_owned(),
                _ => "Unknown".to_owned(),
            };
            if o["spec"]["unschedulable"] == true {
                status.push_str(",SchedulingDisabled");
            }
            let roles: Vec<&str> = o["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
                .collect();
            let roles = if roles.is_empty() {
                "<none>".to_owned()
            } else {
                roles.join(",")
            };
            vec![
                name,
                json!(status),
                json!(roles),
                age,
                o["status"]["nodeInfo"]["kubeletVersion"].clone(),
            ]
        }
        "pods" => {
            let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = if ready_condition(o) == Some("True") {
                total
            } else {
                0
            };
            let status = if o["metadata"]["deletionTimestamp"].is_null() {
                o["status"]["phase"]
                    .as_str()
                    .unwrap_or("Unknown")
                    .to_owned()
            } else {
                "Terminating".to_owned()
            };
            let restarts: i64 = o["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts),
                age,
            ]
        }
        "statefulsets" => {
            let ready = o["status"]["readyReplicas"].as_i64().unwrap_or(0);
            let want = o["spec"]["replicas"].as_i64().unwrap_or(1);
            vec![name, json!(format!("{ready}/{want}")), age]
        }
        "poddisruptionbudgets" => vec![
            name,
            json!(or_na(&o["spec"]["minAvailable"])),
            json!(or_na(&o["spec"]["maxUnavailable"])),
            o["status"]["disruptionsAllowed"].clone(),
            age,
        ],
        _ => vec![name, age],
    }
}

fn row(resource: &Resource, object: &Value, include_object: bool) -> Value {
    let embedded = if include_object {
        object.clone()
    } else {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
    };
    json!({"cells": cells(resource, object), "object": embedded})
}

/// The Table of `objects`; `with_columns` false for a watch event after the first.
pub fn table(
    resource: &Resource,
    objects: &[Value],
    metadata: Value,
    include_object: bool,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| row(resource, o, include_object))
        .collect();
    let mut table = json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "rows": rows,
    });
    if with_columns {
        table["columnDefinitions"] = json!(columns(resource));
    }
    table
}
