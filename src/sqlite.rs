//! SQLite as rollgate keeps it: opened durably (WAL, `synchronous=FULL`), schema
//! versioned in `PRAGMA user_version` and moved forward by numbered migrations, each in
//! its own transaction. The embedded queue and the run store both open their files here.

use rusqlite::{Connection, OpenFlags, Transaction};
use std::path::Path;
use std::time::Duration;

/// One schema change. Migration `n` (1-based, its place in the list) takes a database at
/// version `n - 1` to version `n`.
pub type Migration = fn(&Transaction<'_>) -> Result<(), MigrationError>;

/// Why a database could not be opened at the schema this rollgate knows.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// SQLite failed.
    #[error("{file}: {source}")]
    Sql {
        /// The database, e.g. `store.db`.
        file: String,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// A newer rollgate wrote this file.
    #[error(
        "{file} has schema version {found}, newer than the {known} this rollgate knows: run the rollgate that wrote it, or a newer one"
    )]
    Newer {
        /// The database.
        file: String,
        /// Its version.
        found: u32,
        /// The newest version this build knows.
        known: u32,
    },
    /// A migration found data it cannot carry forward.
    #[error("{file}: migration to version {version}: {why}")]
    Data {
        /// The database.
        file: String,
        /// The version being migrated to.
        version: u32,
        /// What is wrong, and what to do.
        why: String,
    },
}

impl MigrationError {
    /// A SQLite error in a migration, before the file name is known.
    pub fn sql(source: rusqlite::Error) -> Self {
        Self::Sql {
            file: String::new(),
            source,
        }
    }

    /// Bad data found by a migration, before the file name and version are known.
    pub fn data(why: impl Into<String>) -> Self {
        Self::Data {
            file: String::new(),
            version: 0,
            why: why.into(),
        }
    }

    fn in_file(self, name: &str, to: u32) -> Self {
        match self {
            Self::Sql { source, .. } => Self::Sql {
                file: name.to_owned(),
                source,
            },
            Self::Data { why, .. } => Self::Data {
                file: name.to_owned(),
                version: to,
                why,
            },
            newer @ Self::Newer { .. } => newer,
        }
    }
}

impl From<rusqlite::Error> for MigrationError {
    fn from(source: rusqlite::Error) -> Self {
        Self::sql(source)
    }
}

/// Opens (creates) `path` with the durability rollgate relies on and migrates it to the
/// newest of `migrations`.
pub fn open(path: &Path, migrations: &[Migration]) -> Result<Connection, MigrationError> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let mut conn = open_durable(path).map_err(|e| MigrationError::sql(e).in_file(&name, 0))?;
    migrate(&mut conn, &name, migrations)?;
    Ok(conn)
}

fn open_durable(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(conn)
}

/// A second, read-only connection to the database at `path`, opened after [`open`]: in
/// WAL mode its reads see the last commit and neither wait for the writer nor hold it up.
/// None for an in-memory database, which no second connection can see.
pub fn open_reader(path: &Path) -> rusqlite::Result<Option<Connection>> {
    if path.as_os_str() == ":memory:" {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(Some(conn))
}

/// The schema version of `conn`.
pub fn version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
}

/// Applies the migrations `conn` has not had yet, each with its version bump in one
/// transaction, so a crash leaves the file at a version it really has.
pub fn migrate(
    conn: &mut Connection,
    name: &str,
    migrations: &[Migration],
) -> Result<u32, MigrationError> {
    let known = u32::try_from(migrations.len()).unwrap_or(u32::MAX);
    let found = version(conn).map_err(|e| MigrationError::sql(e).in_file(name, 0))?;
    if found > known {
        return Err(MigrationError::Newer {
            file: name.to_owned(),
            found,
            known,
        });
    }
    for (to, migration) in (found + 1..=known).zip(&migrations[found as usize..]) {
        let mut step = || -> Result<(), MigrationError> {
            let tx = conn.transaction()?;
            migration(&tx)?;
            tx.pragma_update(None, "user_version", to)?;
            tx.commit()?;
            Ok(())
        };
        step().map_err(|e| e.in_file(name, to))?;
    }
    Ok(known)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_a(tx: &Transaction<'_>) -> Result<(), MigrationError> {
        tx.execute_batch("CREATE TABLE a (x INTEGER)")?;
        Ok(())
    }

    fn add_b(tx: &Transaction<'_>) -> Result<(), MigrationError> {
        tx.execute_batch("ALTER TABLE a ADD COLUMN b TEXT")?;
        Ok(())
    }

    fn refuse(_: &Transaction<'_>) -> Result<(), MigrationError> {
        Err(MigrationError::data("row 7 cannot be carried forward"))
    }

    #[test]
    fn a_new_file_gets_every_migration_and_an_old_one_only_the_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = open(&path, &[create_a]).unwrap();
        assert_eq!(version(&conn).unwrap(), 1);
        conn.execute("INSERT INTO a (x) VALUES (1)", []).unwrap();
        drop(conn);
        let conn = open(&path, &[create_a, add_b]).unwrap();
        assert_eq!(version(&conn).unwrap(), 2);
        let (x, b): (i64, Option<String>) = conn
            .query_row("SELECT x, b FROM a", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!((x, b), (1, None), "data kept across the migration");
        drop(conn);
        // Opening again applies nothing (ALTER TABLE twice would fail).
        assert_eq!(
            version(&open(&path, &[create_a, add_b]).unwrap()).unwrap(),
            2
        );
    }

    #[test]
    fn a_failed_migration_leaves_the_file_at_the_version_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        drop(open(&path, &[create_a]).unwrap());
        let err = open(&path, &[create_a, add_b, refuse])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "t.db: migration to version 3: row 7 cannot be carried forward"
        );
        let conn = open_durable(&path).unwrap();
        assert_eq!(version(&conn).unwrap(), 2, "version 2 applied and kept");
    }

    #[test]
    fn a_file_from_a_newer_rollgate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        drop(open(&path, &[create_a, add_b]).unwrap());
        let err = open(&path, &[create_a]).unwrap_err().to_string();
        assert!(
            err.starts_with("t.db has schema version 2, newer than the 1 this rollgate knows"),
            "{err}"
        );
    }
}
