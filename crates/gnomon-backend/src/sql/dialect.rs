//! What differs between the SQL databases, as data: each backend module
//! declares one [`Dialect`], and [`super::query::Query`] and the shared
//! store code read it.

use super::migrate::{Migration, MigrationLock};

#[derive(Debug)]
pub struct Dialect {
    pub name: &'static str,
    /// `$1, $2, …` placeholders instead of `?`.
    pub numbered: bool,
    /// `" FOR UPDATE"` where rows are locked by locking reads; empty for
    /// SQLite, whose `BEGIN IMMEDIATE` takes the database's write lock.
    pub for_update: &'static str,
    /// The two-argument maximum: `GREATEST` (MySQL, PostgreSQL) or `MAX` (SQLite).
    pub greatest: &'static str,
    /// How a write transaction begins, if not with the driver's default.
    pub begin: Option<&'static str>,
    /// Rows per multi-row `CASE` update (long, to save round trips). SQLite
    /// compiles a `CASE` with n branches in O(n²); its leader writes do not
    /// take this path (see [`crate::sqlite::write`]).
    pub case_chunk: usize,
    /// Turns an INSERT into insert-or-ignore; `{key}` is a column of the table.
    pub ignore_suffix: &'static str,
    /// A query returning every job's `[uid, version, last_scheduled_at]`
    /// as one JSON array (SQLite, whose driver pays per row), or none.
    pub heads_json: Option<&'static str>,
    /// The schema's steps (`migrations/<database>/`), in order.
    pub migrations: &'static [Migration],
    /// How concurrent migrations are kept apart.
    pub migration_lock: MigrationLock,
    /// Whether a migration statement's error says its change is already
    /// there (MySQL, whose steps are not transactional; see `migrate.rs`).
    pub already_made: fn(&sqlx::Error) -> bool,
    /// One integer, above 0 when the old version table
    /// `gnomon_migrations` exists.
    pub legacy_table_query: &'static str,
    /// Its versions, old → new (`migrate.rs`).
    pub legacy: &'static [(i64, i64)],
    /// The database's size in bytes, one BIGINT (`gnomon_store_size_bytes`).
    pub size_query: &'static str,
    /// The database server's clock, Unix ms as one BIGINT; none where the
    /// database is this machine's (SQLite).
    pub clock_query: Option<&'static str>,
}

/// For databases whose steps are transactional: no error means "already made".
pub(crate) fn never_made(_: &sqlx::Error) -> bool {
    false
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A dialect for unit tests of the shared code.
    pub(crate) const PLAIN: Dialect = Dialect {
        name: "plain",
        numbered: false,
        for_update: "",
        greatest: "MAX",
        begin: None,
        case_chunk: 32,
        ignore_suffix: " ON CONFLICT DO NOTHING",
        heads_json: None,
        migrations: &[],
        migration_lock: MigrationLock::Begin("BEGIN"),
        already_made: never_made,
        legacy_table_query: "",
        legacy: &[],
        size_query: "",
        clock_query: None,
    };
}
