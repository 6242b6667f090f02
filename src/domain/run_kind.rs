//! The kinds of run: one per workflow that makes runs, named by the workflow itself and
//! made known to the rest through [`register`] (`workflows::register` does it for all).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::RwLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a run does: the name of the workflow that makes it, e.g. `k8s-upgrade`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKind(&'static str);

/// The run kinds this process knows: those a stored or posted run may name.
static KNOWN: RwLock<BTreeSet<RunKind>> = RwLock::new(BTreeSet::new());

impl RunKind {
    /// The run kind named `name` (kebab-case, as the API and the metrics show it).
    pub const fn new(name: &'static str) -> Self {
        Self(name)
    }

    /// The name used in the API and in metrics.
    pub fn name(self) -> &'static str {
        self.0
    }

    /// The run kind named `name`, if it is one this process knows.
    pub fn known(name: &str) -> Option<Self> {
        let known = KNOWN
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        known.iter().copied().find(|k| k.0 == name)
    }

    /// Every run kind this process knows, by name.
    pub fn all_known() -> Vec<Self> {
        let known = KNOWN
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        known.iter().copied().collect()
    }
}

/// Makes `kinds` known: stored and posted runs may name them. Registering one again
/// changes nothing.
pub fn register(kinds: impl IntoIterator<Item = RunKind>) {
    let mut known = KNOWN
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    known.extend(kinds);
}

impl fmt::Display for RunKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for RunKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for RunKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Self::known(&name).ok_or_else(|| {
            let known: Vec<&str> = Self::all_known().into_iter().map(Self::name).collect();
            serde::de::Error::custom(format!(
                "unknown run kind {name:?}; this build knows {}",
                if known.is_empty() {
                    "none (no workflow is registered)".to_owned()
                } else {
                    known.join(", ")
                }
            ))
        })
    }
}

impl utoipa::PartialSchema for RunKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let names: Vec<&str> = Self::all_known().into_iter().map(Self::name).collect();
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("What a run does: the workflow that makes it."))
            .enum_values((!names.is_empty()).then_some(names))
            .into()
    }
}

impl utoipa::ToSchema for RunKind {
    fn name() -> std::borrow::Cow<'static, str> {
        "RunKind".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_kind_reads_back_and_an_unknown_one_is_refused_naming_the_known() {
        let kind = RunKind::new("test-kind");
        register([kind]);
        register([kind]);
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(json, "\"test-kind\"");
        assert_eq!(serde_json::from_str::<RunKind>(&json).unwrap(), kind);
        let err = serde_json::from_str::<RunKind>("\"test-kinds\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown run kind \"test-kinds\""), "{err}");
        assert!(err.contains("test-kind"), "{err}");
    }
}
