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
    /// Each node's own, read off its `/etc/os-release` (`ID`, then `ID_LIKE`) when the
    /// sentinel is read: `file` on Debian and Ubuntu, `needs-restarting` on the RHEL
    /// family, `zypper` on SUSE, `flatcar` on Flatcar. A node of another OS is an error
    /// naming it, never "no reboot needed". For a cluster of mixed OSes.
    Auto,
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
    /// (SUSE), `flatcar` (update_engine), or `auto`, each node's own by its os-release:
    /// how a node's OS says it needs a reboot; each tool's own answer is read as its own.
    /// Not with `sentinel_command`.
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
    /// The script that tells whether a node needs a reboot: exit 0 yes, 1 no, anything
    /// else an error.
    pub fn sentinel_script(&self) -> String {
        match (&self.sentinel_command, self.sentinel_preset) {
            (Some(command), _) => format!("{command}\n"),
            (None, SentinelPreset::Auto) => self.auto_script(),
            (None, preset) => self.preset_script(preset),
        }
    }

    /// `preset`'s own question, its answer turned into this one's: 0 needs a reboot, 1
    /// not, else an error.
    fn preset_script(&self, preset: SentinelPreset) -> String {
        let ask = |command: &str, needed: u8, not_needed: u8| {
            format!(
                "{command} >/dev/null 2>&1\ncase $? in {needed}) exit 0 ;; {not_needed}) exit 1 ;; *) exit 2 ;; esac\n"
            )
        };
        match preset {
            SentinelPreset::File | SentinelPreset::Auto => {
                format!("test -e '{}'\n", self.sentinel_file.display())
            }
            SentinelPreset::NeedsRestarting => ask("needs-restarting -r", 1, 0),
            SentinelPreset::Zypper => ask("zypper --non-interactive needs-rebooting", 102, 0),
            SentinelPreset::Flatcar => "status=$(update_engine_client -status 2>/dev/null) || exit 2\ncase \"$status\" in *CURRENT_OP=UPDATE_STATUS_UPDATED_NEED_REBOOT*) exit 0 ;; *CURRENT_OP=*) exit 1 ;; *) exit 2 ;; esac\n".to_owned(),
        }
    }

    /// The preset of the node's own OS, chosen on the node from its os-release (the file
    /// `OS_RELEASE` names, else `/etc/os-release`): its `ID` first, then each of
    /// `ID_LIKE`, so a derivative (Pop!_OS, Oracle Linux, SLES) takes its family's.
    fn auto_script(&self) -> String {
        let branch = |patterns: &str, preset: SentinelPreset| {
            let body = self.preset_script(preset).replace('\n', "\n    ");
            format!("  {patterns})\n    {}\n    exit $? ;;\n", body.trim_end())
        };
        let mut script = String::from(
            "os=${OS_RELEASE:-/etc/os-release}\n\
             [ -r \"$os\" ] || { echo \"$os is not readable: no reboot sentinel is known for this node\" >&2; exit 2; }\n\
             ids=$(. \"$os\" && echo \"${ID:-} ${ID_LIKE:-}\")\n\
             for id in $ids; do\n\
             case \"$id\" in\n",
        );
        for (patterns, preset) in [
            ("debian|ubuntu", SentinelPreset::File),
            (
                "rhel|centos|fedora|rocky|almalinux|ol",
                SentinelPreset::NeedsRestarting,
            ),
            (
                "suse|opensuse|opensuse-*|sles|sles_sap|sle-micro",
                SentinelPreset::Zypper,
            ),
            ("flatcar", SentinelPreset::Flatcar),
        ] {
            script.push_str(&branch(patterns, preset));
        }
        script.push_str(
            "esac\ndone\n\
             echo \"no reboot sentinel is known for this OS ($(. \"$os\" && echo \"${PRETTY_NAME:-${ID:-unknown}}\")): set reboot.sentinel_preset or reboot.sentinel_command\" >&2\n\
             exit 2\n",
        );
        script
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
            (None, SentinelPreset::Auto) => format!(
                "each node's own by its os-release (file {} on Debian and Ubuntu)",
                self.sentinel_file.display()
            ),
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

    /// The exit status and standard error of `preset`'s script, run by bash on a node
    /// whose os-release reads `os` and whose `tools` (name, shell body) stand in for the
    /// OS's own.
    fn ask(preset: SentinelPreset, os: &str, tools: &[(&str, &str)]) -> (Option<i32>, String) {
        let node = tempfile::tempdir().unwrap();
        for (tool, body) in tools {
            let path = node.path().join(tool);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::process::Command::new("chmod")
                .arg("+x")
                .arg(&path)
                .status()
                .unwrap();
        }
        std::fs::write(node.path().join("os-release"), os).unwrap();
        let config = RebootConfig {
            sentinel_preset: preset,
            sentinel_file: node.path().join("reboot-required"),
            ..RebootConfig::default()
        };
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(config.sentinel_script())
            .env("PATH", format!("{}:/usr/bin:/bin", node.path().display()))
            .env("OS_RELEASE", node.path().join("os-release"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The exit status of `preset`'s script with `tool` standing in as a shell script of
    /// `body`.
    fn answer(preset: SentinelPreset, tool: &str, body: &str) -> Option<i32> {
        ask(preset, "", &[(tool, body)]).0
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

    /// `auto` asks each node's own tool by its os-release, `ID` first, then `ID_LIKE`: the
    /// tools stand in answering "needed" where the node's own would be asked, and "not
    /// needed" (or failing) everywhere else, so a wrong choice shows. An OS it does not
    /// know is an error naming the OS, never "no reboot needed".
    #[test]
    fn auto_reads_each_nodes_own_sentinel_by_its_os_release() {
        let os = |id: &str, like: &str| {
            format!("PRETTY_NAME=\"{id} test\"\nID={id}\nID_LIKE=\"{like}\"\n")
        };
        let needed = |tool: &str| -> Vec<(&'static str, &'static str)> {
            let mut tools = vec![
                ("needs-restarting", "exit 0"),
                ("zypper", "exit 0"),
                ("update_engine_client", "echo CURRENT_OP=UPDATE_STATUS_IDLE"),
            ];
            match tool {
                "needs-restarting" => tools[0].1 = "exit 1",
                "zypper" => tools[1].1 = "exit 102",
                "flatcar" => tools[2].1 = "echo CURRENT_OP=UPDATE_STATUS_UPDATED_NEED_REBOOT",
                _ => {}
            }
            tools
        };
        let cases = [
            (os("rocky", "rhel centos fedora"), "needs-restarting", 0),
            (os("ol", "fedora"), "needs-restarting", 0),
            (os("almalinux", ""), "needs-restarting", 0),
            (os("opensuse-leap", "suse opensuse"), "zypper", 0),
            (os("sles", ""), "zypper", 0),
            (os("flatcar", "coreos"), "flatcar", 0),
            (os("pop", "ubuntu debian"), "file", 1),
            (os("ubuntu", "debian"), "needs-restarting", 1),
            (os("rocky", "rhel"), "zypper", 1),
        ];
        for (release, tool, want) in cases {
            let (status, err) = ask(SentinelPreset::Auto, &release, &needed(tool));
            assert_eq!(status, Some(want), "{release:?} with {tool}: {err}");
        }

        // Debian and Ubuntu read `sentinel_file`, here beside the node's os-release.
        let node = tempfile::tempdir().unwrap();
        std::fs::write(node.path().join("os-release"), os("debian", "")).unwrap();
        let config = RebootConfig {
            sentinel_preset: SentinelPreset::Auto,
            sentinel_file: node.path().join("reboot-required"),
            ..RebootConfig::default()
        };
        let status = |config: &RebootConfig| {
            std::process::Command::new("bash")
                .arg("-c")
                .arg(config.sentinel_script())
                .env("OS_RELEASE", node.path().join("os-release"))
                .status()
                .unwrap()
                .code()
        };
        assert_eq!(status(&config), Some(1));
        std::fs::write(node.path().join("reboot-required"), "").unwrap();
        assert_eq!(status(&config), Some(0));

        let (status, err) = ask(SentinelPreset::Auto, &os("alpine", ""), &needed("file"));
        assert_eq!(status, Some(2));
        assert!(
            err.contains("no reboot sentinel is known for this OS (alpine test)"),
            "{err}"
        );
        let (status, err) = ask(SentinelPreset::Auto, "", &[]);
        assert_eq!(status, Some(2), "{err}");
    }
}
