//! Reading a request body into its typed form: every problem at once, each naming its
//! field as the API does (`alerts[0].labels.x`), in words a person can act on.

use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt;

/// One problem with one field of an input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// Path of the field, e.g. `alerts[0].startsAt`; empty for the whole body.
    pub field: String,
    /// What is wrong, in words a person can act on.
    pub problem: String,
}

/// Every problem found in an input, reported together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldErrors(Vec<FieldError>);

impl FieldErrors {
    /// Whether the body itself was refused (not an object): no field is then reported.
    pub(crate) fn is_empty_body(&self) -> bool {
        self.0.iter().any(|e| e.field.is_empty())
    }
    /// Records a problem at `field`.
    pub fn push(&mut self, field: &str, problem: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_owned(),
            problem: problem.into(),
        });
    }
    /// How many problems were found.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The problems, in the order found.
    pub fn iter(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }
    /// `Ok(value)` when nothing was recorded.
    pub fn into_result<T>(self, value: T) -> Result<T, Self> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            if e.field.is_empty() {
                f.write_str(&e.problem)?;
            } else {
                write!(f, "{}: {}", e.field, e.problem)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for FieldErrors {}

/// Reads `body` into the request type `W`, reporting every field serde refuses: a refused
/// field is recorded (with its path, in words a person can act on) and dropped, and the
/// body read again, so one answer names every bad field. `W` takes every field as
/// optional (`Option`); what is required is checked by its validation, which
/// skips the fields recorded here.
pub fn read_body<W: serde::de::DeserializeOwned + Default>(
    body: &Value,
    errors: &mut FieldErrors,
) -> W {
    if !body.is_object() {
        errors.push("", "the body must be a JSON object");
        return W::default();
    }
    let mut body = body.clone();
    let mut dropped = BTreeSet::new();
    loop {
        let error = match serde_path_to_error::deserialize::<_, W>(&body) {
            Ok(read) => return read,
            Err(e) => e,
        };
        let mut path = segments(error.path());
        let message = error.into_inner().to_string();
        let problem = match message.strip_prefix("unknown field `") {
            Some(rest) => {
                let (name, known) = match rest.rsplit_once("`, expected one of ") {
                    Some((name, known)) => (name, known.replace('`', "")),
                    None => (
                        rest.rsplit_once('`').map_or(rest, |(n, _)| n),
                        String::new(),
                    ),
                };
                // The path may stop at the object that holds the unknown key.
                if path.last() != Some(&Segment::Key(name.to_owned())) {
                    path.push(Segment::Key(name.to_owned()));
                }
                format!("is not a known field (known: {known})")
            }
            None => refused(&message),
        };
        if !dropped.insert(path.clone()) {
            // Emptying it was not enough: give up on the whole top-level field.
            if !drop_at(&mut body, &path[..path.len().min(1)]) {
                return W::default();
            }
            continue;
        }
        errors.push(&field_name(&path), problem);
        if !drop_at(&mut body, &path) {
            return W::default();
        }
    }
}

/// One step of a field path: a key of an object or an index of an array.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Segment {
    Key(String),
    Index(usize),
}

/// The steps of the path serde stopped at.
fn segments(path: &serde_path_to_error::Path) -> Vec<Segment> {
    path.iter()
        .filter_map(|s| match s {
            serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
            serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
            serde_path_to_error::Segment::Enum { variant } => Some(Segment::Key(variant.clone())),
            serde_path_to_error::Segment::Unknown => None,
        })
        .collect()
}

/// A path as the API names fields: `alerts[0].labels.x`; a key that is empty or would
/// read as more than one step is quoted (`labels."a.b"`, `""`).
fn field_name(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                let plain = !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '/'));
                if plain {
                    out.push_str(k);
                } else {
                    out.push_str(&serde_json::to_string(k).unwrap_or_default());
                }
            }
        }
    }
    out
}

/// Drops what `path` points at so the body can be read again: a key is removed from its
/// object; an array element is emptied (`{}`), so the others keep their indices. False
/// when there is nothing there.
fn drop_at(body: &mut Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = body;
    for segment in parents {
        let next = match segment {
            Segment::Key(k) => at.get_mut(k.as_str()),
            Segment::Index(i) => at.get_mut(*i),
        };
        match next {
            Some(v) => at = v,
            None => return false,
        }
    }
    match (last, at) {
        (Segment::Key(k), Value::Object(obj)) => obj.remove(k).is_some(),
        (Segment::Index(i), Value::Array(items)) => match items.get_mut(*i) {
            Some(item) => {
                *item = Value::Object(Map::new());
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// A serde_json message about a value, in the words the API answers with.
fn refused(message: &str) -> String {
    let message = message
        .split(" at line ")
        .next()
        .unwrap_or(message)
        .to_owned();
    let expected = message.rsplit_once(", expected ").map(|(_, e)| e);
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let value = rest.split('`').next().unwrap_or_default();
        return format!("{value:?} is not {}", expected.unwrap_or("known"));
    }
    match expected {
        Some("a string") => "must be a string".into(),
        Some("a boolean") => "must be true or false".into(),
        Some("u64" | "u32" | "usize") => "must be a whole number".into(),
        Some("a sequence") => "must be a list".into(),
        _ => message,
    }
}
