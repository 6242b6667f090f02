//! The API's clients: who holds which token and what it may do, re-read from the token
//! files while rollgate runs (rotation without a restart; a removed file revokes at once).
//!
//! `server.tokens_dir` holds one file per client: the file name is the client's name, the
//! first line its token. `server.scopes.<name>` lists what that client may do.
//! `server.token_file` stays an all-scopes token, for the client named [`ADMIN`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use subtle::ConstantTimeEq;

use crate::domain::scope::Scope;

/// The client name `server.token_file`'s token stands for.
pub const ADMIN: &str = "admin";
/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// How often the token files are looked at again.
pub const RELOAD_EVERY: Duration = Duration::from_millis(250);

/// A client the API knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its name: the token file's name (`admin` for `server.token_file`).
    pub name: String,
    /// What it may do.
    pub scopes: BTreeSet<Scope>,
}

impl Client {
    /// Whether it may do what `scope` allows.
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// Where the tokens come from.
#[derive(Debug, Clone, Default)]
pub struct TokenSources {
    /// The all-scopes token (`server.token_file`), if any.
    pub admin_file: Option<PathBuf>,
    /// One file per client (`server.tokens_dir`), if configured.
    pub dir: Option<PathBuf>,
    /// Each client's scopes (`server.scopes`).
    pub scopes: BTreeMap<String, BTreeSet<Scope>>,
}

/// Why the token files cannot be read as they are.
#[derive(Debug, thiserror::Error)]
pub enum ClientsError {
    /// A file or the directory cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A token is missing or too short (its value is never shown).
    #[error("the token in {path} is shorter than {MIN_TOKEN_LEN} characters")]
    Short {
        /// The file.
        path: PathBuf,
    },
    /// Two clients hold the same token, so the audit could not tell them apart.
    #[error("{first} and {second} hold the same token: give each client its own")]
    Shared {
        /// One client.
        first: String,
        /// The other.
        second: String,
    },
}

/// Every client and its token, as read at one moment.
#[derive(Default)]
struct Table {
    entries: Vec<(String, Arc<Client>)>,
}

/// The clients rollgate accepts now; shared by every HTTP worker.
pub struct Clients {
    sources: TokenSources,
    table: RwLock<Arc<Table>>,
}

impl Clients {
    /// Reads every token file once; an error names the file (never the token).
    pub fn load(sources: TokenSources) -> Result<Self, ClientsError> {
        let table = read_table(&sources)?;
        Ok(Self {
            sources,
            table: RwLock::new(Arc::new(table)),
        })
    }

    /// The client `token` belongs to. Every known token is compared, each in constant
    /// time, so the answer's timing does not tell how much of a token was right.
    pub fn identify(&self, token: &str) -> Option<Arc<Client>> {
        let table = self.table.read().ok()?.clone();
        let mut found = None;
        for (known, client) in &table.entries {
            if bool::from(known.as_bytes().ct_eq(token.as_bytes())) {
                found = Some(client.clone());
            }
        }
        found
    }

    /// The clients known now, by name.
    pub fn list(&self) -> Vec<Arc<Client>> {
        let Ok(table) = self.table.read() else {
            return Vec::new();
        };
        let mut clients: Vec<Arc<Client>> = table.entries.iter().map(|(_, c)| c.clone()).collect();
        clients.sort_by(|a, b| a.name.cmp(&b.name));
        clients
    }

    /// The names of the clients known now, sorted.
    pub fn names(&self) -> Vec<String> {
        self.list().iter().map(|c| c.name.clone()).collect()
    }

    /// Reads the files again; keeps the clients as they were when the files cannot be read
    /// as they are (a half-written rotation), except that a client whose file is gone is
    /// revoked at once.
    pub fn reload(&self) {
        let next = match read_table(&self.sources) {
            Ok(table) => table,
            Err(e) => {
                tracing::warn!(error = %e, "token files unreadable; revoking only the clients whose file is gone");
                let Ok(current) = self.table.read() else {
                    return;
                };
                let present = present_clients(&self.sources);
                Table {
                    entries: current
                        .entries
                        .iter()
                        .filter(|(_, c)| present.contains(&c.name))
                        .cloned()
                        .collect(),
                }
            }
        };
        let changed = self
            .table
            .read()
            .map(|t| names_and_tokens(&t) != names_and_tokens(&next))
            .unwrap_or(true);
        if changed {
            tracing::info!(clients = ?next.entries.iter().map(|(_, c)| c.name.as_str()).collect::<Vec<_>>(), "API clients reloaded");
            if let Ok(mut table) = self.table.write() {
                *table = Arc::new(next);
            }
        }
    }

    /// Re-reads the files every [`RELOAD_EVERY`] until `stop` fires.
    pub async fn watch(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        super::reread_every(RELOAD_EVERY, stop, move || self.reload(), |()| {}).await;
    }
}

fn names_and_tokens(table: &Table) -> Vec<(&str, &str, &BTreeSet<Scope>)> {
    table
        .entries
        .iter()
        .map(|(t, c)| (c.name.as_str(), t.as_str(), &c.scopes))
        .collect()
}

/// Whether a directory entry is a client's token file: Kubernetes Secret volumes also
/// hold `..data` and timestamped directories, and editors leave dot files behind.
fn is_client_file(name: &str) -> bool {
    !name.starts_with('.') && !name.ends_with('~')
}

/// Whether `name` can name a client: it goes into logs, metric labels, runs' histories and
/// the CloudEvents `source` of what the client sends, so letters, digits, `.`, `_` and `-`
/// only, 1-64 of them, not starting with a dot.
pub fn is_client_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn present_clients(sources: &TokenSources) -> BTreeSet<String> {
    let mut present = BTreeSet::new();
    if sources.admin_file.as_ref().is_some_and(|p| p.is_file()) {
        present.insert(ADMIN.to_owned());
    }
    if let Some(dir) = &sources.dir
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_client_file(&name) && entry.path().is_file() {
                present.insert(name);
            }
        }
    }
    present
}

/// The first line of a token file, trimmed and long enough.
pub fn read_token_file(path: &Path) -> Result<String, ClientsError> {
    let raw = std::fs::read_to_string(path).map_err(|source| ClientsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let token = raw.lines().next().unwrap_or_default().trim().to_owned();
    if token.len() < MIN_TOKEN_LEN {
        return Err(ClientsError::Short {
            path: path.to_owned(),
        });
    }
    Ok(token)
}

fn read_table(sources: &TokenSources) -> Result<Table, ClientsError> {
    let mut entries: Vec<(String, Arc<Client>)> = Vec::new();
    if let Some(path) = &sources.admin_file {
        let token = read_token_file(path)?;
        entries.push((
            token,
            Arc::new(Client {
                name: ADMIN.to_owned(),
                scopes: crate::workflows::scopes().into_iter().collect(),
            }),
        ));
    }
    if let Some(dir) = &sources.dir {
        let listing = std::fs::read_dir(dir).map_err(|source| ClientsError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut files: Vec<(String, PathBuf)> = listing
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .filter(|(name, path)| is_client_file(name) && path.is_file())
            .collect();
        files.sort();
        for (name, path) in files {
            if !is_client_name(&name) {
                tracing::warn!(file = %path.display(), "not a client name (letters, digits, '.', '_', '-'; at most 64); the file is not read");
                continue;
            }
            let token = read_token_file(&path)?;
            let scopes = sources.scopes.get(&name).cloned().unwrap_or_default();
            if scopes.is_empty() {
                tracing::warn!(client = %name, "a token file without server.scopes.{name}: the client may do nothing");
            }
            entries.push((token, Arc::new(Client { name, scopes })));
        }
    }
    for (i, (token, client)) in entries.iter().enumerate() {
        if let Some((_, other)) = entries[..i].iter().find(|(t, _)| t == token) {
            return Err(ClientsError::Shared {
                first: other.name.clone(),
                second: client.name.clone(),
            });
        }
    }
    Ok(Table { entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, token: &str) {
        std::fs::write(dir.join(name), format!("{token}\n")).expect("write");
    }

    fn sources(dir: &Path) -> TokenSources {
        TokenSources {
            admin_file: None,
            dir: Some(dir.to_owned()),
            scopes: [
                ("alertmanager".to_owned(), [Scope::ALERTS_WRITE].into()),
                (
                    "alice".to_owned(),
                    [Scope::READ, Scope::RUNS_CONTROL].into(),
                ),
            ]
            .into(),
        }
    }

    #[test]
    fn each_file_is_a_client_with_its_configured_scopes() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "alertmanager", "am-token-0123456789");
        write(dir.path(), "alice", "alice-token-0123456789");
        write(dir.path(), "stranger", "stranger-token-0123456789");
        write(dir.path(), ".hidden", "hidden-token-0123456789");
        write(dir.path(), "bad\nname", "forged-token-0123456789");
        std::fs::create_dir(dir.path().join("..data")).expect("mkdir");
        let clients = Clients::load(sources(dir.path())).expect("load");
        assert_eq!(clients.names(), ["alertmanager", "alice", "stranger"]);
        let am = clients.identify("am-token-0123456789").expect("known");
        assert_eq!(am.name, "alertmanager");
        assert!(am.may(Scope::ALERTS_WRITE) && !am.may(Scope::RUNS_CONTROL));
        let stranger = clients
            .identify("stranger-token-0123456789")
            .expect("known");
        assert!(stranger.scopes.is_empty());
        assert!(clients.identify("hidden-token-0123456789").is_none());
        assert!(clients.identify("forged-token-0123456789").is_none());
        assert!(clients.identify("am-token-012345678").is_none());
        assert!(clients.identify("").is_none());
    }

    #[test]
    fn rotation_and_removal_are_seen_on_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "alice", "alice-token-0123456789");
        let clients = Clients::load(sources(dir.path())).expect("load");
        write(dir.path(), "alice", "alice-token-rotated-01");
        clients.reload();
        assert!(clients.identify("alice-token-0123456789").is_none());
        assert!(clients.identify("alice-token-rotated-01").is_some());
        std::fs::remove_file(dir.path().join("alice")).expect("rm");
        clients.reload();
        assert!(clients.identify("alice-token-rotated-01").is_none());
    }

    #[test]
    fn a_bad_file_keeps_the_others_and_revokes_only_what_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "alice", "alice-token-0123456789");
        write(dir.path(), "alertmanager", "am-token-0123456789");
        let clients = Clients::load(sources(dir.path())).expect("load");
        write(dir.path(), "alertmanager", "short");
        clients.reload();
        assert!(clients.identify("am-token-0123456789").is_some());
        std::fs::remove_file(dir.path().join("alice")).expect("rm");
        clients.reload();
        assert!(clients.identify("alice-token-0123456789").is_none());
        assert!(clients.identify("am-token-0123456789").is_some());
    }

    #[test]
    fn refusals_name_the_file_never_the_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "alice", "tiny");
        let err = Clients::load(sources(dir.path())).err().expect("refused");
        let text = err.to_string();
        assert!(text.contains("alice") && !text.contains("tiny"), "{text}");
        write(dir.path(), "alice", "same-token-0123456789");
        write(dir.path(), "alertmanager", "same-token-0123456789");
        let err = Clients::load(sources(dir.path())).err().expect("refused");
        let text = err.to_string();
        assert!(
            text.contains("same token") && !text.contains("same-token"),
            "{text}"
        );
    }
}
