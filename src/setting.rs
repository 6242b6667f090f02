//! What every settings section is made of, whichever part of rollgate it belongs to: the
//! problems its `check` finds, the bounds it holds keys to (the reference and the schema
//! print them), the lists that come as a TOML array or one comma-separated string, and the
//! schemas of values a custom deserializer reads. A leaf: `config` assembles the sections,
//! and each part (a workflow, the queue) defines its own with these.

use serde::de::{self, DeserializeOwned, Deserializer, SeqAccess, Visitor};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One bad setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key, e.g. `server.listen`.
    pub key: String,
    /// What is wrong and what would be right.
    pub message: String,
}

/// A bound that a section's `check` holds one key to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// A whole number from `min` to `max`.
    Count {
        /// Smallest value accepted.
        min: u64,
        /// Largest value accepted.
        max: u64,
    },
    /// A duration from `min` to `max`.
    Duration {
        /// Shortest value accepted.
        min: Duration,
        /// Longest value accepted.
        max: Duration,
    },
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::Count { min, max } => write!(f, "{min} to {max}"),
            Bound::Duration { min, max } => write!(
                f,
                "{} to {}",
                humantime::format_duration(*min),
                humantime::format_duration(*max)
            ),
        }
    }
}

/// The problems of one section, keyed `section.key`.
pub struct Problems {
    section: &'static str,
    found: Vec<Problem>,
    bounds: Vec<(String, Bound)>,
}

impl Problems {
    /// No problems yet in `section`.
    pub fn new(section: &'static str) -> Self {
        Self {
            section,
            found: Vec::new(),
            bounds: Vec::new(),
        }
    }

    /// What was found.
    pub fn into_problems(self) -> Vec<Problem> {
        self.found
    }

    /// The bounds the checks held keys to, keyed `section.key`.
    pub fn into_bounds(self) -> Vec<(String, Bound)> {
        self.bounds
    }

    fn bound(&mut self, key: &str, bound: Bound) {
        self.bounds.push((format!("{}.{key}", self.section), bound));
    }

    /// `key` is wrong: `message` says how.
    pub fn add(&mut self, key: &str, message: impl Into<String>) {
        self.found.push(Problem {
            key: format!("{}.{key}", self.section),
            message: message.into(),
        });
    }

    /// `value` of `key` lies within `min..=max`.
    pub fn range<N>(&mut self, key: &str, value: N, min: u64, max: u64)
    where
        N: TryInto<u64> + Copy + fmt::Display,
    {
        self.bound(key, Bound::Count { min, max });
        if !(min..=max).contains(&value.try_into().unwrap_or(u64::MAX)) {
            self.add(
                key,
                format!("{value} must be a whole number from {min} to {max}"),
            );
        }
    }

    /// `value` of `key`, when set, lies within `min..=max`.
    pub fn range_if_set<N>(&mut self, key: &str, value: Option<N>, min: u64, max: u64)
    where
        N: TryInto<u64> + Copy + fmt::Display,
    {
        match value {
            Some(value) => self.range(key, value, min, max),
            None => self.bound(key, Bound::Count { min, max }),
        }
    }

    /// `value` of `key` lies within `min_ms..=max_ms` milliseconds.
    pub fn duration(&mut self, key: &str, value: Duration, min_ms: u64, max_ms: u64) {
        let (min, max) = (Duration::from_millis(min_ms), Duration::from_millis(max_ms));
        self.bound(key, Bound::Duration { min, max });
        if value < min || value > max {
            self.add(
                key,
                format!(
                    "{} must be a duration like 500ms, 30s, 5m or 1h, from {} to {}",
                    humantime::format_duration(value),
                    humantime::format_duration(min),
                    humantime::format_duration(max)
                ),
            );
        }
    }

    /// A name for a queue, exchange, namespace or user: 1-255 of letters, digits, `._-:`.
    pub fn name(&mut self, key: &str, value: &str) {
        let ok = !value.is_empty()
            && value.len() <= 255
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b));
        if !ok {
            self.add(
                key,
                format!("{value:?} must be 1-255 of letters, digits and . _ - :"),
            );
        }
    }

    /// A file path that is set is not empty.
    pub fn path(&mut self, key: &str, value: Option<&PathBuf>) {
        if value.is_some_and(|p| p.as_os_str().is_empty()) {
            self.add(key, "must not be empty");
        }
    }

    /// An http(s) URL.
    pub fn http_url(&mut self, key: &str, value: &str) {
        let ok = reqwest::Url::parse(value).is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
        if !ok {
            self.add(key, format!("{value:?} is not an http(s) URL"));
        }
    }

    /// CA, client certificate and key of this section: a certificate needs its key.
    pub fn tls_files(
        &mut self,
        ca: &Option<PathBuf>,
        cert: &Option<PathBuf>,
        key: &Option<PathBuf>,
    ) {
        self.path("ca_file", ca.as_ref());
        self.path("cert_file", cert.as_ref());
        self.path("key_file", key.as_ref());
        if cert.is_some() != key.is_some() {
            self.add(
                "cert_file",
                format!(
                    "a client certificate needs both {0}.cert_file and {0}.key_file",
                    self.section
                ),
            );
        }
    }
}

/// A section of the settings as its part defines it: read by serde (unknown keys refused,
/// every key defaulted) and checked as a whole once read.
pub trait Section: DeserializeOwned + Default {
    /// Adds what is wrong with the section's values to `p`, and the bounds it holds them
    /// to.
    fn check(&self, p: &mut Problems);

    /// Its lines in `rollgate check-config`'s summary, as (label, text).
    fn summary(&self, _around: &Around) -> Vec<(&'static str, String)> {
        Vec::new()
    }
}

/// What a section's summary may depend on beyond the section itself.
#[derive(Debug, Clone, Copy)]
pub struct Around {
    /// Whether a cluster is configured (`cluster.kubeconfig` or `cluster.in_cluster`).
    pub cluster_configured: bool,
}

/// Where the sections are read from: the configuration tree `config` assembles.
pub trait SectionSource {
    /// Section `name`, read; a bad key is reported and left at its default.
    fn take<T: DeserializeOwned + Default>(&mut self, name: &'static str) -> T;
}

/// The field names serde reads for `T`, asked of its derived `Deserialize`.
pub fn fields<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Fields(&'static [&'static str]);
    #[derive(Debug)]
    struct Asked;
    impl fmt::Display for Asked {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("fields asked")
        }
    }
    impl std::error::Error for Asked {}
    impl de::Error for Asked {
        fn custom<M: fmt::Display>(_: M) -> Self {
            Asked
        }
    }
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Asked;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Asked> {
            Err(Asked)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Asked> {
            self.0 = fields;
            Err(Asked)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut asked = Fields(&[]);
    let _ = T::deserialize(&mut asked);
    asked.0
}

/// A TOML array of strings, or one comma-separated string (as the environment gives it).
pub fn string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct List;
    impl<'de> Visitor<'de> for List {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of strings or a comma-separated string")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<String>()? {
                out.push(item);
            }
            Ok(out)
        }
    }
    d.deserialize_any(List)
}

/// The schemas of the values a custom deserializer reads (named in `schema_with`).
pub mod schemas {
    use schemars::{Schema, SchemaGenerator, json_schema};

    /// The schema keyword naming a value's kind in words, for the reference page (editors
    /// ignore keywords they do not know).
    pub const KIND: &str = "x-rollgate-kind";

    /// A duration in humantime's words: `500ms`, `30s`, `5m`, `1h 30m`, `7d`.
    pub fn duration(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^\\s*([0-9]+\\s*[a-zA-Zµ]+\\s*)+$",
            KIND: "duration",
        })
    }

    /// A list of strings, or one comma-separated string.
    pub fn string_list(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                {"type": "array", "items": {"type": "string"}},
                {"type": "string"},
            ],
            KIND: "list of strings (or one comma-separated string)",
        })
    }
}
