//! Self-silences (`gate.self_silences`): while rollgate drains and upgrades a node it keeps
//! an Alertmanager silence for the alerts it knows it causes there. What that silence is:
//! the configured matchers with `{node}` filled in, a guard that keeps every gate alert
//! out of it, and a comment that names the run and the node (how rollgate finds it again
//! after a restart).

use std::fmt;

/// How a silence matcher compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~` (a regular expression, anchored by Alertmanager)
    Regex,
    /// `!~`
    NotRegex,
}

/// One matcher of a silence: `name=value`, `name!=value`, `name=~re` or `name!~re`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilenceMatcher {
    /// The label.
    pub name: String,
    /// The value or expression; in a template, `{node}` stands for the node in hand.
    pub value: String,
    /// How it compares.
    pub op: MatchOp,
}

/// The placeholder for the node in hand.
pub const NODE: &str = "{node}";
/// Who creates the silences, as Alertmanager shows it.
pub const CREATED_BY: &str = "rollgate";

impl SilenceMatcher {
    /// Parses one matcher.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        let (name, op, value) = [
            ("!~", MatchOp::NotRegex),
            ("=~", MatchOp::Regex),
            ("!=", MatchOp::NotEqual),
            ("=", MatchOp::Equal),
        ]
        .into_iter()
        .find_map(|(token, op)| raw.split_once(token).map(|(n, v)| (n, op, v)))
        .ok_or_else(|| {
            format!("{raw:?} is not a matcher like alertname=KubeNodeUnschedulable or node={NODE}")
        })?;
        let (name, value) = super::gate::label_and_value(raw, name, value)?;
        Ok(Self { name, value, op })
    }

    /// Whether this matcher compares by regular expression.
    pub fn is_regex(&self) -> bool {
        matches!(self.op, MatchOp::Regex | MatchOp::NotRegex)
    }

    /// Whether it matches on equality (not its negation).
    pub fn is_equal(&self) -> bool {
        matches!(self.op, MatchOp::Equal | MatchOp::Regex)
    }
}

impl fmt::Display for SilenceMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Regex => "=~",
            MatchOp::NotRegex => "!~",
        };
        write!(f, "{}{op}{:?}", self.name, self.value)
    }
}

/// Checks the configured templates: each parses, and one names the node (a silence that
/// does not would quiet the whole cluster).
pub fn check_templates(raw: &[String]) -> Result<Vec<SilenceMatcher>, String> {
    let matchers = raw
        .iter()
        .map(|r| SilenceMatcher::parse(r))
        .collect::<Result<Vec<_>, _>>()?;
    if !matchers.is_empty() && !matchers.iter().any(|m| m.value.contains(NODE)) {
        return Err(format!(
            "no matcher names the node: add one like node={NODE}, or the silence would cover every node"
        ));
    }
    Ok(matchers)
}

/// The silence rollgate keeps for `node` in run `run_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilencePlan {
    /// Its matchers, `{node}` filled in.
    pub matchers: Vec<SilenceMatcher>,
    /// Names the run and the node; rollgate finds its silence by it.
    pub comment: String,
}

/// The silence for `node` in run `run_id` from `templates`. Unless a template speaks of
/// `gate_label` itself, a guard `gate_label!="true"` keeps every gate alert out of it: a
/// silenced gate alert would open the gate (Alertmanager's list supersedes the board).
pub fn plan(
    templates: &[SilenceMatcher],
    gate_label: &str,
    node: &str,
    run_id: &str,
) -> SilencePlan {
    let mut matchers: Vec<SilenceMatcher> = templates
        .iter()
        .map(|m| SilenceMatcher {
            value: if m.is_regex() {
                m.value.replace(NODE, &regex_escape(node))
            } else {
                m.value.replace(NODE, node)
            },
            ..m.clone()
        })
        .collect();
    if !templates.iter().any(|m| m.name == gate_label) {
        matchers.push(SilenceMatcher {
            name: gate_label.to_owned(),
            value: "true".into(),
            op: MatchOp::NotEqual,
        });
    }
    SilencePlan {
        matchers,
        comment: format!("rollgate run {run_id}: node {node} in hand"),
    }
}

/// `s` with the characters a regular expression treats specially escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_parse() {
        let cases = [
            (
                "alertname=KubeNodeUnschedulable",
                Some(("alertname", "KubeNodeUnschedulable", MatchOp::Equal)),
            ),
            ("node={node}", Some(("node", "{node}", MatchOp::Equal))),
            (
                "alertname=~\"KubeNode.*|KubeletDown\"",
                Some(("alertname", "KubeNode.*|KubeletDown", MatchOp::Regex)),
            ),
            (
                "severity!=critical",
                Some(("severity", "critical", MatchOp::NotEqual)),
            ),
            (
                "instance!~\"cp-.*\"",
                Some(("instance", "cp-.*", MatchOp::NotRegex)),
            ),
            ("nothing", None),
            ("=x", None),
            ("a b=c", None),
        ];
        for (raw, want) in cases {
            let got = SilenceMatcher::parse(raw).ok();
            let want = want.map(|(name, value, op)| SilenceMatcher {
                name: name.into(),
                value: value.into(),
                op,
            });
            assert_eq!(got, want, "{raw}");
        }
    }

    #[test]
    fn templates_must_name_the_node() {
        let ok = |v: &[&str]| check_templates(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(ok(&[]).is_ok_and(|m| m.is_empty()));
        assert!(ok(&["alertname=KubeNodeUnschedulable", "node={node}"]).is_ok());
        assert!(ok(&["alertname=KubeNodeUnschedulable"]).is_err());
        assert!(ok(&["alertname", "node={node}"]).is_err());
    }

    #[test]
    fn a_plan_fills_in_the_node_and_keeps_gate_alerts_out() {
        let templates = check_templates(&[
            "alertname=~KubeNodeUnschedulable|KubeletDown".into(),
            "node={node}".into(),
            "instance=~{node}:.*".into(),
        ])
        .unwrap();
        let p = plan(&templates, "upgrade_gate", "w1.example", "run-7");
        let shown: Vec<String> = p.matchers.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                r#"alertname=~"KubeNodeUnschedulable|KubeletDown""#,
                r#"node="w1.example""#,
                r#"instance=~"w1\\.example:.*""#,
                r#"upgrade_gate!="true""#,
            ]
        );
        assert_eq!(p.comment, "rollgate run run-7: node w1.example in hand");
        // Silencing a gate alert on purpose: the template says so, no guard is added.
        let on_purpose = check_templates(&[
            "alertname=KubeNodeNotReady".into(),
            "node={node}".into(),
            "upgrade_gate=true".into(),
        ])
        .unwrap();
        let p = plan(&on_purpose, "upgrade_gate", "w1", "r");
        assert_eq!(p.matchers.len(), 3);
    }
}
