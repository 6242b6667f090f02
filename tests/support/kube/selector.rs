//! Label and field selectors, parsed and matched as the API server does.

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector; the empty one matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits `text` at commas that are not inside parentheses.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 316
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn values(list: &str) -> Result<Vec<String>, String> {
    let inner = list
        .trim()
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised list of values, found {list:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(requirements));
        }
        for term in split_terms(text) {
            let term = term.trim();
            let requirement = if let Some(key) = term.strip_prefix('!') {
                Requirement::DoesNotExist(key.trim().to_owned())
            } else if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, list)) = term.split_once(" notin ") {
                Requirement::NotIn(key.trim().to_owned(), values(list)?)
            } else if let Some((key, list)) = term.split_once(" in ") {
                Requirement::In(key.trim().to_owned(), values(list)?)
            } else {
                Requirement::Exists(term.to_owned())
            };
            let key = match &requirement {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::DoesNotExist(k) => k,
            };
            if !valid_key(key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key {key:?}"
                ));
            }
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    /// The selector of a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`);
    /// an error for an operator the API server does not know.
    pub fn from_object(selector: &Value) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if let Some(labels) = selector["matchLabels"].as_object() {
            for (k, v) in labels {
                requirements.push(Requirement::Equals(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        for expression in selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let key = expression["key"].as_str().unwrap_or_default().to_owned();
            let values: Vec<String> = expression["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            requirements.push(match expression["operator"].as_str() {
                Some("In") => Requirement::In(key, values),
                Some("NotIn") => Requirement::NotIn(key, values),
                Some("Exists") => Requirement::Exists(key),
                Some("DoesNotExist") => Requirement::DoesNotExist(key),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            });
        }
        Ok(Self(requirements))
    }

    /// Whether `object`'s labels satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let get = |k: &str| labels[k].as_str();
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v),
            Requirement::NotEquals(k, v) => get(k) != Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: `field=value` and `field!=value` terms.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The fields each resource can be selected by, besides `metadata.name` and
/// `metadata.namespace`.
fn selectable(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
        ],
        "nodes" => &["spec.unschedulable"],
        "namespaces" => &["status.phase"],
        _ => &[],
    }
}

fn field_value<'a>(object: &'a Value, path: &str) -> String {
    let mut at: &'a Value = object;
    for part in path.split('.') {
        at = &at[part];
    }
    match at {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Null if path == "spec.unschedulable" => "false".to_owned(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl FieldSelector {
    /// Parses `text` for resource `plural`; the error the API server gives for a field it
    /// does not index.
    pub fn parse(text: &str, plural: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let known = ["metadata.name", "metadata.namespace"].contains(&field)
                || selectable(plural).contains(&field);
            if !known {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_owned(), equal, value.to_owned()));
        }
        Ok(Self(terms))
    }

    /// The value `field` must equal, when a term asks for one.
    pub fn equal_to(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, equal, _)| f == field && *equal)
            .map(|(_, _, value)| value.as_str())
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0
            .iter()
            .all(|(field, equal, value)| (field_value(object, field) == *value) == *equal)
    }
}
