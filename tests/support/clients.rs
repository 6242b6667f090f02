//! API clients for the scope tests: a tokens directory with one file per client, and the
//! settings giving each its scopes.

use std::path::Path;

/// The clients: name, token, scopes (as configured, comma-separated).
pub const CLIENTS: &[(&str, &str, &str)] = &[
    ("alertmanager", "am-0123456789abcdef", "alerts:write"),
    ("detector", "det-0123456789abcdef", "detections:write"),
    ("roller", "roll-0123456789abcdef", "etcd-rolls:write"),
    ("alice", "alice-0123456789abcdef", "runs:control,read"),
    ("bob", "bob-0123456789abcdef", "runs:control,read"),
    ("viewer", "view-0123456789abcdef", "read"),
    ("nobody", "nobody-0123456789abcdef", ""),
];

/// The token of client `name` of [`CLIENTS`].
pub fn token_of(name: &str) -> &'static str {
    CLIENTS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, t, _)| *t)
        .expect("known client")
}

/// Writes a token file the way a Secret volume update lands: a new file renamed over.
pub fn write_token(dir: &Path, name: &str, token: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, format!("{token}\n")).expect("write token");
    std::fs::rename(&tmp, dir.join(name)).expect("rename token");
}

/// A tokens directory with every client of [`CLIENTS`], and the settings naming it.
pub fn clients_dir() -> (tempfile::TempDir, Vec<(String, String)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut env = vec![(
        "ROLLGATE__SERVER__TOKENS_DIR".to_owned(),
        dir.path().display().to_string(),
    )];
    for (name, token, scopes) in CLIENTS {
        write_token(dir.path(), name, token);
        if !scopes.is_empty() {
            env.push((
                format!("ROLLGATE__SERVER__SCOPES__{}", name.to_uppercase()),
                (*scopes).to_owned(),
            ));
        }
    }
    (dir, env)
}
