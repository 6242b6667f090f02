//! The reboot workflow's settings (section `reboot`): a key's doc comment is its
//! documentation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

use crate::setting::{Around, Problems, Section, string_list};

/// Whether an upgrade reboots a node its script left needing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AfterUpgrade {
    /// Never (default): a later reboot run takes the node, drained again.
    Never,
    /// After a node's script the sentinel is read; when set, the node is rebooted inside
    /// the same drain, before it is verified and uncordoned.
    IfRequired,
}

/// How a node tells that it needs a reboot, by the OS it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SentinelPreset {
    /// `sentinel_file` exists (default; Debian and Ubuntu: `/var/run/reboot-required`,
    /// kured's sentinel).
    File,
    /// RHEL, Rocky, Alma, Fedora: `needs-restarting -r` (dnf-utils) exits 1 when a
    /// reboot is needed, 0 when not.
    NeedsRestarting,
    /// SUSE, openSUSE: `zypper needs-rebooting` exits 102 when a reboot is needed, 0 when
    /// not.
    Zypper,
    /// Flatcar Container Linux: `update_engine_client -status` says
    /// `CURRENT_OP=UPDATE_STATUS_UPDATED_NEED_REBOOT` once an update is applied and waits
    /// for the reboot.
    Flatcar,
}

/// Node reboots (section `reboot`): what runs on a node to tell whether it needs a reboot
/// and to reboot it. Operator settings only: no request ever carries a command.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RebootConfig {
    /// The file whose presence means the node needs a reboot (kured's sentinel, default
    /// `/var/run/reboot-required`); used unless `sentinel_command` is set.
    pub sentinel_file: PathBuf,
    /// A command run on the node instead of looking for the file: exit 0 means it needs a
    /// reboot, exit 1 that it does not; anything else is an error (default: none).
    pub sentinel_command: Option<String>,
    /// `file` (default: `sentinel_file`), `needs-restarting` (RHEL family), `zypper`
    /// (SUSE) or `flatcar` (update_engine): how the node's OS says it needs a reboot; each
    /// tool's own answer is read as its own. Not with `sentinel_command`.
    pub sentinel_preset: SentinelPreset,
    /// The command that reboots the node, over SSH (default `sudo -n systemctl reboot`:
    /// the SSH user is not root, and `deploy/node/sudoers` allows it exactly this). The
    /// connection dropping as the node goes down is expected; a non-zero exit while the
    /// node keeps its boot id is a refusal, retried and then halted on, naming the node
    /// and what the command said.
    pub command: String,
    /// How long a node may take from the reboot command to being Ready with another boot
    /// id before the run halts naming it (default 15m).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub timeout: Duration,
    /// Whether control-plane nodes may be rebooted (default true: one at a time, first,
    /// between health checks, with one etcd leadership change when etcd is stacked).
    /// False: a request naming one is refused, and `{}` leaves them out, named.
    pub control_planes: bool,
    /// Labels set on a node before its reboot (`key=value`; kured's
    /// `--pre-reboot-node-labels`), e.g. to take it out of a load balancer.
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::setting::schemas::string_list")]
    pub labels_before: Vec<String>,
    /// Labels set on a node once it is back (`key=value`; kured's
    /// `--post-reboot-node-labels`).
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::setting::schemas::string_list")]
    pub labels_after: Vec<String>,
    /// `never` (default) or `if-required`: after an upgrade's node script, a node whose
    /// sentinel is set is rebooted inside the same drain, so it is drained once, not twice.
    pub after_upgrade: AfterUpgrade,
}

impl Default for RebootConfig {
    fn default() -> Self {
        Self {
            sentinel_file: PathBuf::from("/var/run/reboot-required"),
            sentinel_command: None,
            sentinel_preset: SentinelPreset::File,
            command: "sudo -n systemctl reboot".into(),
            timeout: Duration::from_secs(15 * 60),
            control_planes: true,
            labels_before: Vec::new(),
            labels_after: Vec::new(),
            after_upgrade: AfterUpgrade::Never,
        }
    }
}

impl RebootConfig {
    /// The script that tells whether a node needs a reboot: exit 0 yes, 1 no.
    pub fn sentinel_script(&self) -> String {
        // Each preset's own answer, turned into this one's: 0 needs a reboot, 1 not, else
        // an error.
        let preset = |command: &str, needed: u8, not_needed: u8| {
            format!(
                "{command} >/dev/null 2>&1\ncase $? in {needed}) exit 0 ;; {not_needed}) exit 1 ;; *) exit 2 ;; esac\n"
            )
        };
        match (&self.sentinel_command, self.sentinel_preset) {
            (Some(command), _) => format!("{command}\n"),
            (None, SentinelPreset::File) => format!("test -e '{}'\n", self.sentinel_file.display()),
            (None, SentinelPreset::NeedsRestarting) => preset("needs-restarting -r", 1, 0),
            (None, SentinelPreset::Zypper) => {
                preset("zypper --non-interactive needs-rebooting", 102, 0)
            }
            (None, SentinelPreset::Flatcar) => "status=$(update_engine_client -status 2>/dev/null) || exit 2\ncase \"$status\" in *CURRENT_OP=UPDATE_STATUS_UPDATED_NEED_REBOOT*) exit 0 ;; *CURRENT_OP=*) exit 1 ;; *) exit 2 ;; esac\n".to_owned(),
        }
    }

    /// `labels` as (key, value) pairs (`check` has refused any that does not parse).
    pub fn labels(labels: &[String]) -> Vec<(String, Option<String>)> {
        labels
            .iter()
            .filter_map(|raw| raw.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), Some(v.trim().to_owned())))
            .collect()
    }
}

impl Section for RebootConfig {
    fn check(&self, p: &mut Problems) {
        let file = self.sentinel_file.to_string_lossy();
        if !file.starts_with('/')
            || !file
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
        {
            p.add(
                "sentinel_file",
                format!(
                    "{file:?} must be an absolute path of letters, digits, '/', '.', '_' and '-'"
                ),
            );
        }
        if self
            .sentinel_command
            .as_deref()
            .is_some_and(|c| c.trim().is_empty())
        {
            p.add(
                "sentinel_command",
                "must not be empty (leave it out to use sentinel_file)",
            );
        }
        if self.sentinel_command.is_some() && self.sentinel_preset != SentinelPreset::File {
            p.add(
                "sentinel_preset",
                "is set beside sentinel_command: say how a node tells it needs a reboot once",
            );
        }
        if self.command.trim().is_empty() {
            p.add("command", "must not be empty");
        }
        p.duration("timeout", self.timeout, 1000, 24 * 3_600_000);
        for (key, labels) in [
            ("labels_before", &self.labels_before),
            ("labels_after", &self.labels_after),
        ] {
            for raw in labels {
                let ok = raw.split_once('=').is_some_and(|(k, v)| {
                    let (k, v) = (k.trim(), v.trim());
                    !k.is_empty()
                        && k.len() <= 253
                        && k.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"./-_".contains(&b))
                        && v.len() <= 63
                        && v.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
                });
                if !ok {
                    p.add(key, format!("{raw:?} is not a label key=value"));
                }
            }
        }
    }

    fn summary(&self, _around: &Around) -> Vec<(&'static str, String)> {
        let sentinel = match (&self.sentinel_command, self.sentinel_preset) {
            (Some(command), _) => format!("command `{command}`"),
            (None, SentinelPreset::File) => format!("file {}", self.sentinel_file.display()),
            (None, SentinelPreset::NeedsRestarting) => "needs-restarting -r".to_owned(),
            (None, SentinelPreset::Zypper) => "zypper needs-rebooting".to_owned(),
            (None, SentinelPreset::Flatcar) => "update_engine_client -status".to_owned(),
        };
        let after = match self.after_upgrade {
            AfterUpgrade::Never => "never",
            AfterUpgrade::IfRequired => "if required",
        };
        vec![(
            "reboots",
            format!(
                "sentinel {sentinel}, command `{}`, timeout {}, control planes {}, after an upgrade {after}",
                self.command,
                humantime::format_duration(self.timeout),
                if self.control_planes { "too" } else { "never" },
            ),
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exit status of `preset`'s script, run by bash with `tool` standing in as a
    /// shell script of `body`.
    fn answer(preset: SentinelPreset, tool: &str, body: &str) -> Option<i32> {
        let bin = tempfile::tempdir().unwrap();
        let path = bin.path().join(tool);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&path)
            .status()
            .unwrap();
        let config = RebootConfig {
            sentinel_preset: preset,
            ..RebootConfig::default()
        };
        std::process::Command::new("bash")
            .arg("-c")
            .arg(config.sentinel_script())
            .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
            .status()
            .unwrap()
            .code()
    }

    /// Each preset's script, run by bash with the OS's tool standing in as a script that
    /// exits as the real one does: 0 needs a reboot, 1 not, 2 the tool failed.
    #[test]
    fn each_presets_answer_is_read_as_its_tool_gives_it() {
        let cases = [
            (SentinelPreset::NeedsRestarting, "needs-restarting", 1, 0),
            (SentinelPreset::NeedsRestarting, "needs-restarting", 0, 1),
            (SentinelPreset::NeedsRestarting, "needs-restarting", 127, 2),
            (SentinelPreset::Zypper, "zypper", 102, 0),
            (SentinelPreset::Zypper, "zypper", 0, 1),
            (SentinelPreset::Zypper, "zypper", 104, 2),
        ];
        for (preset, tool, exits, want) in cases {
            assert_eq!(
                answer(preset, tool, &format!("exit {exits}")),
                Some(want),
                "{preset:?}, {tool} exits {exits}"
            );
        }
        let file = RebootConfig::default().sentinel_script();
        assert_eq!(file, "test -e '/var/run/reboot-required'\n");
    }

    /// Flatcar's preset reads update_engine's status as it prints it: an applied update
    /// waiting for its reboot needs one; any other operation does not; a tool that fails or
    /// says no operation is an error.
    #[test]
    fn flatcars_preset_reads_update_engines_status() {
        let cases = [
            (
                "LAST_CHECKED_TIME=1733300000\nPROGRESS=0.000000\nCURRENT_OP=UPDATE_STATUS_UPDATED_NEED_REBOOT\nNEW_VERSION=4081.2.1\nNEW_SIZE=123\n",
                0,
                0,
            ),
            (
                "LAST_CHECKED_TIME=1733300000\nPROGRESS=0.000000\nCURRENT_OP=UPDATE_STATUS_IDLE\nNEW_VERSION=0.0.0\nNEW_SIZE=0\n",
                0,
                1,
            ),
            ("CURRENT_OP=UPDATE_STATUS_DOWNLOADING\n", 0, 1),
            ("", 1, 2),
            ("Failed to connect to update_engine\n", 0, 2),
        ];
        for (says, exits, want) in cases {
            let tool = format!("printf '{says}'\nexit {exits}");
            assert_eq!(
                answer(SentinelPreset::Flatcar, "update_engine_client", &tool),
                Some(want),
                "{says:?} exit {exits}"
            );
        }
    }

    #[test]
    fn a_preset_beside_a_command_is_refused() {
        let config = RebootConfig {
            sentinel_preset: SentinelPreset::Zypper,
            sentinel_command: Some("true".into()),
            ..RebootConfig::default()
        };
        let mut p = Problems::new("reboot");
        config.check(&mut p);
        let found = p.into_problems();
        assert_eq!(found.len(), 1);
        assert!(
            format!("{:?}", found[0]).contains("sentinel_preset"),
            "{found:?}"
        );
    }
}
