//! A small checker of JSON values against the schemas of rollgate's own `/openapi.json`:
//! `$ref`, objects (properties, required, `additionalProperties: false`),
//! strings with enums, booleans, integers with bounds, arrays. Enough for request bodies.

use serde_json::Value;

/// The schema `schema` stands for, `$ref`s followed within `spec`.
pub fn resolve<'a>(spec: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or_default();
            resolve(spec, &spec["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// The schema of the JSON body `POST path` takes.
pub fn request_schema<'a>(spec: &'a Value, path: &str) -> &'a Value {
    let schema =
        &spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"];
    assert!(schema.is_object(), "POST {path} documents no JSON body");
    resolve(spec, schema)
}

/// Every way `value` breaks `schema`, each with its path.
pub fn problems(spec: &Value, schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check(spec, resolve(spec, schema), value, "$", &mut out);
    out
}

fn types(schema: &Value) -> Vec<&str> {
    match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn check(spec: &Value, schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    if let Some(all) = schema["allOf"].as_array() {
        for s in all {
            check(spec, resolve(spec, s), value, at, out);
        }
    }
    if let Some(any) = schema["oneOf"].as_array().or(schema["anyOf"].as_array()) {
        let fits = |s: &Value| {
            let mut found = Vec::new();
            check(spec, resolve(spec, s), value, at, &mut found);
            found.is_empty()
        };
        if !any.iter().any(fits) {
            out.push(format!("{at}: {value} fits none of the alternatives"));
        }
        return;
    }
    let types = types(schema);
    let is = |t: &str| types.contains(&t);
    if value.is_null() {
        if !types.is_empty() && !is("null") {
            out.push(format!("{at}: null where {types:?} is wanted"));
        }
        return;
    }
    match value {
        Value::Object(obj) if types.is_empty() || is("object") => {
            let props = schema["properties"].as_object();
            for key in schema["required"].as_array().into_iter().flatten() {
                let key = key.as_str().unwrap_or_default();
                if !obj.contains_key(key) {
                    out.push(format!("{at}.{key}: required and missing"));
                }
            }
            let closed = schema["additionalProperties"] == Value::Bool(false);
            if let Some(props) = props {
                for (key, v) in obj {
                    match props.get(key) {
                        Some(s) => check(spec, resolve(spec, s), v, &format!("{at}.{key}"), out),
                        None if closed => {
                            out.push(format!("{at}.{key}: not a documented property"))
                        }
                        None => {}
                    }
                }
            }
            if let Some(values) = schema["additionalProperties"].as_object() {
                let values = Value::Object(values.clone());
                for (key, v) in obj {
                    if props.is_none_or(|p| !p.contains_key(key)) {
                        check(spec, resolve(spec, &values), v, &format!("{at}.{key}"), out);
                    }
                }
            }
        }
        Value::String(s) if types.is_empty() || is("string") => {
            if let Some(allowed) = schema["enum"].as_array()
                && !allowed.iter().any(|a| a == value)
            {
                out.push(format!("{at}: {s:?} is not one of {allowed:?}"));
            }
        }
        Value::Bool(_) if types.is_empty() || is("boolean") => {}
        Value::Number(n) if is("integer") || is("number") || types.is_empty() => {
            if is("integer") && n.as_i64().is_none() && n.as_u64().is_none() {
                out.push(format!("{at}: {n} is not an integer"));
            }
            let x = n.as_f64().unwrap_or_default();
            if schema["minimum"].as_f64().is_some_and(|min| x < min) {
                out.push(format!("{at}: {n} is below the minimum"));
            }
            if schema["maximum"].as_f64().is_some_and(|max| x > max) {
                out.push(format!("{at}: {n} is above the maximum"));
            }
        }
        Value::Array(items) if types.is_empty() || is("array") => {
            for (i, item) in items.iter().enumerate() {
                check(
                    spec,
                    resolve(spec, &schema["items"]),
                    item,
                    &format!("{at}[{i}]"),
                    out,
                );
            }
        }
        other => out.push(format!("{at}: {other} where {types:?} is wanted")),
    }
}
