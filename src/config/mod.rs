//! Settings: embedded defaults, then `--config FILE` (TOML), then `ROLLGATE__SECTION__KEY`
//! environment variables. Each section is deserialized by serde (unknown keys refused);
//! a bad value is reported and left at its default so that the rest of its section is
//! still read, and `rollgate check-config` reports every bad value at once.

pub mod schema;
mod sections;
pub(crate) mod values;

pub use sections::{
    ClusterSettings, DetectConfig, DetectSubmit, EtcdConfig, GateSettings, LogFormat, LogSettings,
    NotifySettings, QueueBackend, QueueSettings, ScheduleSettings, ServerSettings, Settings,
    SshConfig, SshHost, StoreBackend, StoreSettings, WorkerSettings,
};

use config::{Config, Environment, File, FileFormat, Map, Value, ValueKind};
use serde::de::DeserializeOwned;
use std::fmt;
use std::path::{Path, PathBuf};

pub use crate::setting::Problem;
use crate::setting::{SectionSource, fields};
use crate::workflows::WorkflowSettings;

/// Everything wrong with the settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError(pub Vec<Problem>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} bad setting(s):", self.0.len())?;
        for p in &self.0 {
            writeln!(f, "  {}: {}", p.key, p.message)?;
        }
        Ok(())
    }
}

/// Where the queue, the store and the generated token live when `data_dir` is not set.
pub const DEFAULT_DATA_DIR: &str = "./data";

/// The environment variable prefix: `ROLLGATE__SERVER__LISTEN` sets `server.listen`.
pub const ENV_PREFIX: &str = "ROLLGATE";

/// The sections, by name, with the keys each takes (read off the serde types, so this list
/// cannot drift from what is read).
pub fn keys() -> Vec<String> {
    let mut out = vec!["data_dir".to_owned()];
    let mut add = |section: &str, fields: &[&str]| {
        out.extend(fields.iter().map(|f| format!("{section}.{f}")));
    };
    add("server", fields::<ServerSettings>());
    add("queue", fields::<QueueSettings>());
    add("store", fields::<StoreSettings>());
    add("worker", fields::<WorkerSettings>());
    add("gate", fields::<GateSettings>());
    add("notify", fields::<NotifySettings>());
    add("log", fields::<LogSettings>());
    add("cluster", fields::<ClusterSettings>());
    add("ssh", fields::<SshConfig>());
    add("etcd", fields::<EtcdConfig>());
    add("detect", fields::<DetectConfig>());
    add("schedule", fields::<ScheduleSettings>());
    for (section, keys) in WorkflowSettings::keys() {
        add(section, keys);
    }
    out
}

impl Settings {
    /// Loads from embedded defaults, the optional file and the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, None)
    }

    /// Loads with an explicit environment (`None` = the process environment); for tests.
    pub fn load_from(
        file: Option<&Path>,
        env: Option<std::collections::HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut builder = Config::builder();
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError(vec![Problem {
                    key: "--config".into(),
                    message: format!("{} does not exist or is not a file", path.display()),
                }]));
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        let env_source = Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("__")
            .separator("__")
            .source(env);
        builder = builder.add_source(env_source);
        let problem = |message: String| {
            ConfigError(vec![Problem {
                key: file.map_or("environment".into(), |p| p.display().to_string()),
                message,
            }])
        };
        let cfg = builder.build().map_err(|e| problem(e.to_string()))?;
        let root = cfg
            .try_deserialize::<Map<String, Value>>()
            .map_err(|e| problem(e.to_string()))?;
        Self::from_tree(root)
    }

    fn from_tree(mut root: Map<String, Value>) -> Result<Self, ConfigError> {
        let mut problems = Vec::new();
        let data_dir = match root.remove("data_dir") {
            None => PathBuf::from(DEFAULT_DATA_DIR),
            Some(v) => match v.into_string() {
                Ok(s) if !s.is_empty() => PathBuf::from(s),
                _ => {
                    problems.push(Problem {
                        key: "data_dir".into(),
                        message: "must be a directory path".into(),
                    });
                    PathBuf::from(DEFAULT_DATA_DIR)
                }
            },
        };
        let (r, p) = (&mut root, &mut problems);
        let mut settings = Settings {
            data_dir,
            server: take_section(r, "server", p),
            queue: take_section(r, "queue", p),
            store: take_section(r, "store", p),
            worker: take_section(r, "worker", p),
            gate: take_section(r, "gate", p),
            notify: take_section(r, "notify", p),
            log: take_section(r, "log", p),
            cluster: take_section(r, "cluster", p),
            ssh: take_section(r, "ssh", p),
            etcd: take_section(r, "etcd", p),
            detect: take_section(r, "detect", p),
            schedule: take_section(r, "schedule", p),
            workflows: WorkflowSettings::read(&mut Tree(r, p)),
        };
        for key in root.keys() {
            problems.push(Problem {
                key: key.clone(),
                message: "is not a known setting or section".into(),
            });
        }
        settings.resolve_and_check(&mut problems);
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError(problems))
        }
    }
}

/// The configuration tree, as the workflows' sections are read from it.
struct Tree<'a>(&'a mut Map<String, Value>, &'a mut Vec<Problem>);

impl SectionSource for Tree<'_> {
    fn take<T: DeserializeOwned + Default>(&mut self, name: &'static str) -> T {
        take_section(self.0, name, self.1)
    }
}

/// Deserializes section `name` out of `root`. A key serde refuses is reported and dropped,
/// and the section read again, so every bad key of a section is reported and the good
/// ones still count.
fn take_section<T: DeserializeOwned + Default>(
    root: &mut Map<String, Value>,
    name: &str,
    problems: &mut Vec<Problem>,
) -> T {
    let Some(value) = root.remove(name) else {
        return T::default();
    };
    let ValueKind::Table(mut table) = value.kind else {
        problems.push(Problem {
            key: name.to_owned(),
            message: "must be a table of settings".into(),
        });
        return T::default();
    };
    loop {
        let value = Value::new(None, ValueKind::Table(table.clone()));
        let error = match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(section) => return section,
            Err(e) => e,
        };
        let path = error.path().to_string();
        let message = error.into_inner().to_string();
        let key = bad_key(&path, &message).filter(|k| table.contains_key(k));
        let Some(key) = key else {
            problems.push(Problem {
                key: name.to_owned(),
                message,
            });
            return T::default();
        };
        table.remove(&key);
        problems.push(Problem {
            key: format!("{name}.{key}"),
            message: explain(&message),
        });
    }
}

/// The key of a section that a serde error is about: the first segment of its path, or
/// the field an "unknown field" error names.
fn bad_key(path: &str, message: &str) -> Option<String> {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        return rest.split('`').next().map(str::to_owned);
    }
    let first = path.split(['.', '[']).next().unwrap_or_default();
    (!first.is_empty() && first != "?").then(|| first.to_owned())
}

/// A serde message in the words of this configuration (the key is said already).
fn explain(message: &str) -> String {
    let message = message
        .rsplit_once(" for key `")
        .map_or(message, |(text, _)| text);
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let expected = rest.split_once(", expected ").map_or("", |(_, e)| e);
        return format!("is not a known setting (known here: {expected})");
    }
    if let Some((_, value)) = message.split_once("does not have variant constructor ") {
        return format!(
            "{value:?} is not one of the values this key takes (see `rollgate config reference`)"
        );
    }
    if message == "invalid socket address syntax" {
        return "is not an address like 127.0.0.1:8080".into();
    }
    if message.ends_with("expected a duration") {
        return format!("{message} like 500ms, 30s, 5m or 1h 30m");
    }
    message.to_owned()
}

#[cfg(test)]
mod tests;
