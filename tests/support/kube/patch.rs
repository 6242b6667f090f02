//! The three patch types the API server takes: JSON merge patch (RFC 7386), strategic
//! merge patch (with the list merge keys of the fields rollgate and kubectl touch, and the
//! `$patch`, `$retainKeys`, `$deleteFromPrimitiveList` and `$setElementOrder` directives),
//! and JSON patch (RFC 6902).

use serde_json::{Value, json};

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            let Some(object) = target.as_object_mut() else {
                return;
            };
            for (k, v) in fields {
                if v.is_null() {
                    object.remove(k);
                } else {
                    merge(object.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The merge key of a list field under strategic merge patch (`patchMergeKey` in the
/// Kubernetes types), or `None` for a list that a patch replaces whole.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" | "addresses" => "type",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "containerStatuses"
        | "initContainerStatuses" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "ownerReferences" => "uid",
        _ => return None,
    })
}

/// Lists of scalars that strategic merge patch merges as sets (`patchStrategy: merge`).
fn merged_scalar_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Applies a strategic merge patch.
pub fn strategic(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if fields.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replacement = patch.clone();
        if let Some(o) = replacement.as_object_mut() {
            o.remove("$patch");
        }
        *target = replacement;
        return Ok(());
    }
    if fields.get("$patch").and_then(Value::as_str) == Some("delete") {
        *target = json!({});
        return Ok(());
    }
    if !target.is_object() {
        *target = json!({});
    }
    let Some(object) = target.as_object_mut() else {
        return Ok(());
    };
    if let Some(retain) = fields.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        object.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (key, value) in fields {
        if key == "$retainKeys" || key == "$patch" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let gone: Vec<&Value> = value
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            if let Some(list) = object.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|v| !gone.contains(&v));
            }
            continue;
        }
        if key.starts_with('$') {
            return Err(format!("unknown patch directive {key:?}"));
        }
        if value.is_null() {
            object.remove(key);
            continue;
        }
        match (value, merge_key(key)) {
            (Value::Array(items), Some(merge_key)) => {
                let current = object.entry(key.clone()).or_insert_with(|| json!([]));
                merge_list(current, items, merge_key)?;
            }
            (Value::Array(items), None) if merged_scalar_list(key) => {
                let current = object.entry(key.clone()).or_insert_with(|| json!([]));
                if let Some(list) = current.as_array_mut() {
                    for item in items {
                        if !list.contains(item) {
                            list.push(item.clone());
                        }
                    }
                }
            }
            (Value::Object(_), _) => {
                strategic(object.entry(key.clone()).or_insert(Value::Null), value)?;
            }
            _ => {
                object.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(current: &mut Value, items: &[Value], key: &str) -> Result<(), String> {
    if !current.is_array() {
        *current = json!([]);
    }
    let Some(list) = current.as_array_mut() else {
        return Ok(());
    };
    if items
        .iter()
        .any(|i| i["$patch"].as_str() == Some("replace"))
    {
        *list = items
            .iter()
            .filter(|i| i["$patch"].as_str() != Some("replace"))
            .cloned()
            .collect();
        return Ok(());
    }
    for item in items {
        let Some(id) = item.get(key) else {
            return Err(format!(
                "map: {item} does not contain declared merge key: {key}"
            ));
        };
        let position = list.iter().position(|e| e.get(key) == Some(id));
        if item["$patch"].as_str() == Some("delete") {
            if let Some(p) = position {
                list.remove(p);
            }
            continue;
        }
        match position {
            Some(p) => strategic(&mut list[p], item)?,
            None => {
                let mut fresh = Value::Null;
                strategic(&mut fresh, item)?;
                list.push(fresh);
            }
        }
    }
    Ok(())
}

/// Splits a JSON pointer into unescaped tokens.
fn pointer_tokens(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// The parent container of `path` and the last token.
fn parent<'a>(doc: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), String> {
    let mut tokens = pointer_tokens(path)?;
    let last = tokens
        .pop()
        .ok_or_else(|| "the root cannot be patched".to_owned())?;
    let mut at = doc;
    for token in tokens {
        at = match at {
            Value::Object(o) => o
                .get_mut(&token)
                .ok_or_else(|| format!("doc is missing path: {path}"))?,
            Value::Array(a) => {
                let i: usize = token
                    .parse()
                    .map_err(|_| format!("invalid array index {token:?}"))?;
                a.get_mut(i)
                    .ok_or_else(|| format!("doc is missing path: {path}"))?
            }
            _ => return Err(format!("doc is missing path: {path}")),
        };
    }
    Ok((at, last))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let (at, last) = parent(doc, path)?;
    match at {
        Value::Object(o) => {
            o.insert(last, value);
        }
        Value::Array(a) if last == "-" => a.push(value),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid index {last:?}"))?;
            if i > a.len() {
                return Err(format!("index out of bounds: {path}"));
            }
            a.insert(i, value);
        }
        _ => return Err(format!("doc is missing path: {path}")),
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (at, last) = parent(doc, path)?;
    match at {
        Value::Object(o) => o
            .remove(&last)
            .ok_or_else(|| format!("unable to remove nonexistent key: {last}: missing value")),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid index {last:?}"))?;
            (i < a.len())
                .then(|| a.remove(i))
                .ok_or_else(|| format!("index out of bounds: {path}"))
        }
        _ => Err(format!("doc is missing path: {path}")),
    }
}

fn get(doc: &Value, path: &str) -> Result<Value, String> {
    let pointer = path;
    doc.pointer(pointer)
        .cloned()
        .ok_or_else(|| format!("doc is missing path: {path}"))
}

/// Applies an RFC 6902 JSON patch; nothing changes when an operation fails.
pub fn json_patch(target: &mut Value, operations: &Value) -> Result<(), String> {
    let ops = operations
        .as_array()
        .ok_or_else(|| "a JSON patch is a list of operations".to_owned())?;
    let mut doc = target.clone();
    for op in ops {
        let path = op["path"].as_str().ok_or("an operation needs a path")?;
        let value = || op.get("value").cloned().ok_or("an operation needs a value");
        match op["op"].as_str() {
            Some("add") => add(&mut doc, path, value()?)?,
            Some("remove") => {
                remove(&mut doc, path)?;
            }
            Some("replace") => {
                remove(&mut doc, path)?;
                add(&mut doc, path, value()?)?;
            }
            Some("test") => {
                if get(&doc, path)? != value()? {
                    return Err(format!("testing value {path} failed"));
                }
            }
            Some("move") | Some("copy") => {
                let from = op["from"].as_str().ok_or("move and copy need from")?;
                let moved = if op["op"] == "move" {
                    remove(&mut doc, from)?
                } else {
                    get(&doc, from)?
                };
                add(&mut doc, path, moved)?;
            }
            other => return Err(format!("unexpected kind of operation {other:?}")),
        }
    }
    *target = doc;
    Ok(())
}
