//! What the sections are made of: lists that come as a TOML array or, from the
//! environment, as one comma-separated string; label matchers; SSH host entries; and the
//! checks serde cannot express, collected per section.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::collections::HashMap;
use std::fmt;

use crate::domain::budget::{FailureBudget, MaxUnavailable};
use crate::domain::gate::Matcher;
use crate::domain::schedule::{Window, WindowError, Windows};
use crate::domain::scope::Scope;
pub use crate::setting::{Problems, string_list};

/// `server.scopes`: per client, a list of scope names (or one comma-separated string, as
/// the environment gives it).
pub fn scope_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, std::collections::BTreeSet<Scope>>, D::Error> {
    #[derive(serde::Deserialize)]
    struct Names(#[serde(deserialize_with = "string_list")] Vec<String>);
    let raw: std::collections::BTreeMap<String, Names> = serde::Deserialize::deserialize(d)?;
    let mut out = std::collections::BTreeMap::new();
    for (client, Names(names)) in raw {
        let mut scopes = std::collections::BTreeSet::new();
        for name in names {
            let known = crate::workflows::scopes();
            let scope = known
                .iter()
                .copied()
                .find(|s| s.name() == name)
                .ok_or_else(|| {
                    de::Error::custom(format!(
                        "client {client}: unknown scope {name:?} (scopes: {})",
                        known
                            .iter()
                            .map(|s| s.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            scopes.insert(scope);
        }
        out.insert(client, scopes);
    }
    Ok(out)
}

/// A list of `name=value` / `name!=value` matchers.
pub fn matcher_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Matcher>, D::Error> {
    string_list(d)?
        .iter()
        .map(|m| Matcher::parse(m).map_err(de::Error::custom))
        .collect()
}

/// Maintenance windows: a TOML array whose items are `[days] HH:MM-HH:MM [zone]` lines
/// or tables of `days`, `start`, `end`, `time_zone`; or, from the environment, one string
/// of lines separated by `;`.
pub fn window_list<'de, D: Deserializer<'de>>(d: D) -> Result<Windows, D::Error> {
    struct List;
    impl<'de> Visitor<'de> for List {
        type Value = Windows;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of windows, or windows separated by `;`")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            s.split(';')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .enumerate()
                .map(|(i, w)| numbered(i, Window::parse(w)))
                .collect::<Result<_, _>>()
                .map(Windows)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<WindowItem>()? {
                out.push(numbered(out.len(), item.0)?);
            }
            Ok(Windows(out))
        }
    }
    d.deserialize_any(List)
}

fn numbered<E: de::Error>(index: usize, w: Result<Window, WindowError>) -> Result<Window, E> {
    w.map_err(|e| E::custom(format!("window {}: {e}", index + 1)))
}

/// One window as an array item: a line or a table. Its error waits for `numbered`.
struct WindowItem(Result<Window, WindowError>);

impl<'de> de::Deserialize<'de> for WindowItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Item;
        impl<'de> Visitor<'de> for Item {
            type Value = WindowItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a window: `[days] HH:MM-HH:MM [zone]` or a table of days, start, end, time_zone")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(WindowItem(Window::parse(s)))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut days, mut start, mut end, mut zone) =
                    (String::new(), None, None, String::new());
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "days" => days = map.next_value_seed(DaysSeed)?,
                        "start" => start = Some(map.next_value::<String>()?),
                        "end" => end = Some(map.next_value::<String>()?),
                        "time_zone" => zone = map.next_value::<String>()?,
                        other => {
                            return Err(de::Error::custom(format!(
                                "{other:?} is not a key of a window (known: days, start, end, time_zone)"
                            )));
                        }
                    }
                }
                let (Some(start), Some(end)) = (start, end) else {
                    return Err(de::Error::custom("a window needs start and end (HH:MM)"));
                };
                Ok(WindowItem(Window::from_parts(&days, &start, &end, &zone)))
            }
        }
        d.deserialize_any(Item)
    }
}

/// A window's `days`: `"mon-fri"` or `["sat", "sun"]`, as one comma-separated string.
struct DaysSeed;

impl<'de> de::DeserializeSeed<'de> for DaysSeed {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        string_list(d).map(|days| days.join(","))
    }
}

/// A count (`2`) or a percentage (`"25%"`) of workers.
pub fn max_unavailable<'de, D: Deserializer<'de>>(d: D) -> Result<MaxUnavailable, D::Error> {
    count_or_percent(d, MaxUnavailable::parse)
}

/// A count (`1`) or a percentage (`"10%"`) of workers; `0` for none.
pub fn failure_budget<'de, D: Deserializer<'de>>(d: D) -> Result<FailureBudget, D::Error> {
    count_or_percent(d, FailureBudget::parse)
}

/// A count (`3`) or a percentage (`"20%"`) of the cluster's nodes.
pub fn unhealthy_limit<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<crate::domain::budget::UnhealthyLimit, D::Error> {
    count_or_percent(d, crate::domain::budget::UnhealthyLimit::parse)
}

/// A count or a percentage of workers, as a number or a string, read by `parse`.
fn count_or_percent<'de, D: Deserializer<'de>, T>(
    d: D,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, D::Error> {
    struct CountOrPercent<T>(fn(&str) -> Result<T, String>);
    impl<'de, T> Visitor<'de> for CountOrPercent<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a count of workers (2) or a percentage (\"25%\")")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            (self.0)(s).map_err(E::custom)
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
            self.visit_str(&n.to_string())
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
            self.visit_str(&n.to_string())
        }
        fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
            self.visit_str(&n.to_string())
        }
    }
    d.deserialize_any(CountOrPercent(parse))
}

/// A list of `node=[user@]host[:port]` entries, by node.
pub fn host_list<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<String, SshHost>, D::Error> {
    string_list(d)?
        .iter()
        .map(|entry| {
            parse_host_entry(entry).ok_or_else(|| {
                de::Error::custom(format!("{entry:?} is not node=[user@]host[:port]"))
            })
        })
        .collect()
}

/// A Kubernetes node name: lowercase letters, digits, `-` and `.`.
pub fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// `node=[user@]host[:port]`; nothing that could be read as an ssh option.
pub fn parse_host_entry(entry: &str) -> Option<(String, SshHost)> {
    let (node, addr) = entry.split_once('=')?;
    let (user, addr) = match addr.split_once('@') {
        Some((u, rest)) => (Some(u), rest),
        None => (None, addr),
    };
    let (host, port) = match addr.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().ok()?)),
        None => (addr, None),
    };
    let user_ok = user.is_none_or(|u| {
        !u.is_empty()
            && u.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    });
    (is_dns_name(node) && user_ok && !host.is_empty() && !host.starts_with('-')).then(|| {
        (
            node.to_owned(),
            SshHost {
                user: user.map(str::to_owned),
                host: host.to_owned(),
                port,
            },
        )
    })
}

/// Where one node is reached over SSH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshHost {
    /// Login user, when not `ssh.user`.
    pub user: Option<String>,
    /// Host name or address.
    pub host: String,
    /// Port, when not `ssh.port`.
    pub port: Option<u16>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_host_entries_parse() {
        let host = |user: Option<&str>, host: &str, port: Option<u16>| SshHost {
            user: user.map(str::to_owned),
            host: host.into(),
            port,
        };
        let cases = [
            ("cp=10.0.0.5", Some(("cp", host(None, "10.0.0.5", None)))),
            (
                "w1=10.0.0.6:2222",
                Some(("w1", host(None, "10.0.0.6", Some(2222)))),
            ),
            (
                "w2=wizard@n2.lan:22",
                Some(("w2", host(Some("wizard"), "n2.lan", Some(22)))),
            ),
            ("w3", None),
            ("w3=", None),
            ("w3=h:notaport", None),
            ("W3=h", None),
            ("w3=-oProxyCommand=x", None),
            ("w3=a b@h", None),
        ];
        for (entry, want) in cases {
            let got = parse_host_entry(entry);
            let want = want.map(|(n, h)| (n.to_owned(), h));
            assert_eq!(got, want, "{entry}");
        }
    }
}
