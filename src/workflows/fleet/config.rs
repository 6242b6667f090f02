//! The fleet's settings (section `fleet`): a key's doc comment is its documentation.

use schemars::JsonSchema;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

use crate::setting::{Around, Problems, Section};

/// One cluster upstream of this one: its rollgate, asked before an upgrade goes ahead.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// The upstream cluster's name, as its own `fleet.name` says it.
    pub name: String,
    /// The upstream rollgate's base URL (http or https), e.g. `https://rollgate.staging:8080`.
    pub url: String,
    /// A file holding a token with the `read` scope on the upstream rollgate (none: no
    /// token is sent).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// A PEM file of the CA that signed the upstream's server certificate, for https
    /// (none: the system's roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// Fleet waves (section `fleet`): a version reaches this cluster only after every cluster
/// upstream ran it and its gate stayed quiet for a soak.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// This cluster's name in the fleet (default `default`), as downstream clusters name it.
    pub name: String,
    /// The clusters whose rollgate must have run a version first (default: none, and an
    /// upgrade asks nobody). TOML: `[[fleet.upstreams]]` tables.
    pub upstreams: Vec<Upstream>,
    /// How long an upstream must have run the version, its gate quiet all along, before it
    /// goes on here (default 24h). A blocking alert in the soak starts it again once it
    /// resolves.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub soak: Duration,
    /// How long an upgrade waits for its upstreams before the run halts (default 30d).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub max_wait: Duration,
    /// Whether an upgrade whose upstreams are ready also waits for
    /// `POST /v1/runs/{id}/approve` (scope `runs:approve`; default false).
    pub require_approval: bool,
    /// How often a waiting upgrade, and `GET /v1/fleet`'s view, ask the upstreams
    /// (default 60s).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub poll_interval: Duration,
    /// How long one upstream may take to answer before it counts as unreachable
    /// (default 10s).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub timeout: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            name: "default".into(),
            upstreams: Vec::new(),
            soak: Duration::from_secs(24 * 3600),
            max_wait: Duration::from_secs(30 * 24 * 3600),
            require_approval: false,
            poll_interval: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
        }
    }
}

impl Section for FleetConfig {
    fn check(&self, p: &mut Problems) {
        if !is_cluster_name(&self.name) {
            p.add(
                "name",
                format!(
                    "{:?} must be 1-63 lowercase letters, digits and '-'",
                    self.name
                ),
            );
        }
        p.duration("soak", self.soak, 1000, 365 * 24 * 3_600_000);
        p.duration("max_wait", self.max_wait, 1000, 365 * 24 * 3_600_000);
        if self.soak > self.max_wait {
            p.add(
                "soak",
                format!(
                    "{} is longer than fleet.max_wait ({}): no upgrade could ever go ahead",
                    humantime::format_duration(self.soak),
                    humantime::format_duration(self.max_wait)
                ),
            );
        }
        p.duration("poll_interval", self.poll_interval, 100, 3_600_000);
        p.duration("timeout", self.timeout, 100, 300_000);
        let mut seen = std::collections::BTreeSet::new();
        for (i, upstream) in self.upstreams.iter().enumerate() {
            let key = format!("upstreams[{i}]");
            if !is_cluster_name(&upstream.name) {
                p.add(
                    &format!("{key}.name"),
                    format!(
                        "{:?} must be 1-63 lowercase letters, digits and '-'",
                        upstream.name
                    ),
                );
            } else if upstream.name == self.name {
                p.add(
                    &format!("{key}.name"),
                    format!(
                        "{:?} is this cluster itself (fleet.name): a cluster cannot be its own upstream",
                        upstream.name
                    ),
                );
            } else if !seen.insert(upstream.name.as_str()) {
                p.add(
                    &format!("{key}.name"),
                    format!("{:?} names two upstreams", upstream.name),
                );
            }
            p.http_url(&format!("{key}.url"), &upstream.url);
            p.path(&format!("{key}.token_file"), upstream.token_file.as_ref());
            p.path(&format!("{key}.ca_file"), upstream.ca_file.as_ref());
        }
    }

    fn summary(&self, _around: &Around) -> Vec<(&'static str, String)> {
        let upstreams = if self.upstreams.is_empty() {
            "no upstreams".to_owned()
        } else {
            let names: Vec<&str> = self.upstreams.iter().map(|u| u.name.as_str()).collect();
            format!(
                "upstreams {} (soak {}){}",
                names.join(", "),
                humantime::format_duration(self.soak),
                if self.require_approval {
                    ", then an approval"
                } else {
                    ""
                }
            )
        };
        vec![("fleet", format!("{}: {upstreams}", self.name))]
    }
}

/// A cluster's name in the fleet: a DNS label.
fn is_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(name: &str, url: &str) -> Upstream {
        Upstream {
            name: name.into(),
            url: url.into(),
            token_file: None,
            ca_file: None,
        }
    }

    fn problems(config: &FleetConfig) -> Vec<String> {
        let mut p = Problems::new("fleet");
        config.check(&mut p);
        p.into_problems()
            .into_iter()
            .map(|p| format!("{}: {}", p.key, p.message))
            .collect()
    }

    #[test]
    fn bad_fleets_are_refused_naming_the_key() {
        let ok = FleetConfig {
            name: "prod".into(),
            upstreams: vec![upstream("staging", "https://rollgate.staging:8080")],
            ..FleetConfig::default()
        };
        assert!(problems(&ok).is_empty(), "{:?}", problems(&ok));
        let cases: Vec<(FleetConfig, &str)> = vec![
            (
                FleetConfig {
                    upstreams: vec![upstream("staging", "ftp://staging")],
                    ..ok.clone()
                },
                "fleet.upstreams[0].url: \"ftp://staging\" is not an http(s) URL",
            ),
            (
                FleetConfig {
                    upstreams: vec![upstream("prod", "https://x")],
                    ..ok.clone()
                },
                "fleet.upstreams[0].name: \"prod\" is this cluster itself",
            ),
            (
                FleetConfig {
                    upstreams: vec![upstream("dev", "https://a"), upstream("dev", "https://b")],
                    ..ok.clone()
                },
                "fleet.upstreams[1].name: \"dev\" names two upstreams",
            ),
            (
                FleetConfig {
                    soak: Duration::ZERO,
                    ..ok.clone()
                },
                "fleet.soak: 0s must be a duration",
            ),
            (
                FleetConfig {
                    soak: Duration::from_secs(40 * 24 * 3600),
                    ..ok.clone()
                },
                "fleet.soak: 1month 9days 13h 26m 24s is longer than fleet.max_wait (30days)",
            ),
            (
                FleetConfig {
                    name: "Prod!".into(),
                    ..ok.clone()
                },
                "fleet.name: \"Prod!\" must be",
            ),
        ];
        for (config, want) in cases {
            let got = problems(&config);
            assert!(
                got.iter().any(|p| p.starts_with(want)),
                "want {want:?} in {got:?}"
            );
        }
    }
}
