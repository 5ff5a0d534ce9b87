//! What the shared SQL code needs of a sqlx driver: running a [`Query`] on
//! a connection ([`Driver`]), reading columns of a row ([`SqlRow`]) and a
//! transaction that runs queries ([`Tx`]). Each is implemented once, for
//! every driver that has what it needs, so the store code above is generic
//! over the database without naming sqlx's trait bounds.

use std::future::Future;
use std::pin::Pin;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, Row, Type};

use super::decode;
use super::errors::db_err;
use super::query::{Param, Query};
use crate::StoreError;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The number of rows a statement changed (sqlx has no trait for it).
pub trait RowsAffected {
    fn rows(&self) -> u64;
}

#[cfg(feature = "sqlite")]
impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

#[cfg(feature = "mysql")]
impl RowsAffected for sqlx::mysql::MySqlQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

#[cfg(feature = "postgres")]
impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// A sqlx database the shared SQL code runs on: its rows can be read with
/// [`SqlRow`] and into the tables' row types ([`Decodes`]), and it runs a
/// [`Query`] on one of its connections.
pub trait Driver: Database<Row: SqlRow + TableRows> {
    /// Runs a statement; the number of rows it changed.
    fn execute<'c>(conn: &'c mut Self::Connection, q: &'c Query) -> BoxFuture<'c, Result<u64, sqlx::Error>>;
    /// Runs a query; all its rows.
    fn fetch_all<'c>(conn: &'c mut Self::Connection, q: &'c Query) -> BoxFuture<'c, Result<Vec<Self::Row>, sqlx::Error>>;
    /// Runs a query; its first row, if any.
    fn fetch_optional<'c>(conn: &'c mut Self::Connection, q: &'c Query) -> BoxFuture<'c, Result<Option<Self::Row>, sqlx::Error>>;
    /// Runs SQL text as it is, unprepared (one or more statements).
    fn raw<'c>(conn: &'c mut Self::Connection, sql: &'c str) -> BoxFuture<'c, Result<(), sqlx::Error>>;
}

/// The query with its parameters bound, as sqlx takes it.
fn bound<'q, DB>(q: &'q Query) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    i64: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB>,
    Option<&'q str>: Encode<'q, DB>,
    DB: sqlx::database::HasStatementCache,
{
    debug_assert!(q.is_complete(), "a placeholder without a value in {}", q.sql());
    let mut out = sqlx::query::<DB>(q.sql()).persistent(q.persistent());
    for p in q.params() {
        out = match p {
            Param::Int(v) => out.bind(*v),
            Param::Text(v) => out.bind(v.as_deref()),
        };
    }
    out
}

impl<DB> Driver for DB
where
    DB: Database<Row: SqlRow + TableRows>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB>,
    for<'q> Option<&'q str>: Encode<'q, DB>,
    DB::QueryResult: RowsAffected,
    DB: sqlx::database::HasStatementCache,
{
    fn execute<'c>(conn: &'c mut DB::Connection, q: &'c Query) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(async move { Ok(bound::<DB>(q).execute(conn).await?.rows()) })
    }

    fn fetch_all<'c>(conn: &'c mut DB::Connection, q: &'c Query) -> BoxFuture<'c, Result<Vec<DB::Row>, sqlx::Error>> {
        Box::pin(async move { bound::<DB>(q).fetch_all(conn).await })
    }

    fn fetch_optional<'c>(conn: &'c mut DB::Connection, q: &'c Query) -> BoxFuture<'c, Result<Option<DB::Row>, sqlx::Error>> {
        Box::pin(async move { bound::<DB>(q).fetch_optional(conn).await })
    }

    fn raw<'c>(conn: &'c mut DB::Connection, sql: &'c str) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        Box::pin(async move { Executor::execute(conn, sqlx::raw_sql(sql)).await.map(|_| ()) })
    }
}

/// A row that reads as `T` (its `FromRow`), a driver error being the
/// store's.
pub trait Decodes<T> {
    fn decode(&self) -> Result<T, StoreError>;
}

impl<R: Row, T> Decodes<T> for R
where
    T: for<'r> sqlx::FromRow<'r, R>,
{
    fn decode(&self) -> Result<T, StoreError> {
        T::from_row(self).map_err(|e| match e {
            sqlx::Error::ColumnDecode { .. } => StoreError::Corrupt(e.to_string()),
            e => db_err(e),
        })
    }
}

/// Every table's row type a database's rows read as.
pub trait TableRows:
    Decodes<decode::JobsRow>
    + Decodes<decode::RunsRow>
    + Decodes<decode::RunCasRow>
    + Decodes<decode::NotificationsRow>
    + Decodes<decode::AttemptsRow>
    + Decodes<decode::LeadershipRow>
    + Decodes<decode::BackfillsRow>
    + Decodes<decode::HeadRow>
    + Decodes<decode::LiveAttemptRow>
    + Decodes<decode::KeptRow>
    + Decodes<decode::EdgesRow>
{
}

impl<R> TableRows for R where
    R: Decodes<decode::JobsRow>
        + Decodes<decode::RunsRow>
        + Decodes<decode::RunCasRow>
        + Decodes<decode::NotificationsRow>
        + Decodes<decode::AttemptsRow>
        + Decodes<decode::LeadershipRow>
        + Decodes<decode::BackfillsRow>
        + Decodes<decode::HeadRow>
        + Decodes<decode::LiveAttemptRow>
        + Decodes<decode::KeptRow>
        + Decodes<decode::EdgesRow>
{
}

/// A text column of a row type: a `String` on every database. MySQL
/// reports columns with a `_bin` collation (used so names compare
/// case-sensitively, as on the other backends) as binary, so there it is
/// read as bytes and checked as UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

#[cfg(feature = "mysql")]
impl sqlx::Type<sqlx::MySql> for Text {
    fn type_info() -> sqlx::mysql::MySqlTypeInfo {
        <String as sqlx::Type<sqlx::MySql>>::type_info()
    }

    fn compatible(ty: &sqlx::mysql::MySqlTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::MySql>>::compatible(ty) || <Vec<u8> as sqlx::Type<sqlx::MySql>>::compatible(ty)
    }
}

#[cfg(feature = "mysql")]
impl<'r> Decode<'r, sqlx::MySql> for Text {
    fn decode(value: sqlx::mysql::MySqlValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let bytes = <&[u8] as Decode<'r, sqlx::MySql>>::decode(value)?;
        Ok(Text(std::str::from_utf8(bytes)?.to_owned()))
    }
}

#[cfg(feature = "postgres")]
impl sqlx::Type<sqlx::Postgres> for Text {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

#[cfg(feature = "postgres")]
impl<'r> Decode<'r, sqlx::Postgres> for Text {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        <String as Decode<'r, sqlx::Postgres>>::decode(value).map(Text)
    }
}

#[cfg(feature = "sqlite")]
impl sqlx::Type<sqlx::Sqlite> for Text {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <String as sqlx::Type<sqlx::Sqlite>>::type_info()
    }

    fn compatible(ty: &sqlx::sqlite::SqliteTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::Sqlite>>::compatible(ty)
    }
}

#[cfg(feature = "sqlite")]
impl<'r> Decode<'r, sqlx::Sqlite> for Text {
    fn decode(value: sqlx::sqlite::SqliteValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        <String as Decode<'r, sqlx::Sqlite>>::decode(value).map(Text)
    }
}

/// Typed reads of a row's columns, by name (scalar queries' columns; the
/// tables' rows are read as [`Decodes`]).
pub trait SqlRow {
    /// A text column. MySQL reports columns with a `_bin` collation (used
    /// so names compare case-sensitively, as on the other backends) as
    /// binary, so those are read as bytes and checked as UTF-8.
    fn text(&self, column: &str) -> Result<String, StoreError>;
    fn int(&self, column: &str) -> Result<i64, StoreError>;
    /// The first column, an integer or NULL (a scalar query's value).
    fn first_opt_int(&self) -> Result<Option<i64>, StoreError>;
    /// The first column, text or NULL.
    fn first_opt_text(&self) -> Result<Option<String>, StoreError>;

    /// An unsigned integer column (never negative as written).
    fn uint(&self, column: &str) -> Result<u64, StoreError> {
        Ok(u64::try_from(self.int(column)?).unwrap_or(0))
    }
}

fn utf8(column: &str, bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))
}

impl<R> SqlRow for R
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, column: &str) -> Result<String, StoreError> {
        match self.try_get::<String, _>(column) {
            Ok(s) => Ok(s),
            Err(_) => utf8(column, self.try_get(column).map_err(db_err)?),
        }
    }

    fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.try_get(column).map_err(db_err)
    }

    fn first_opt_int(&self) -> Result<Option<i64>, StoreError> {
        self.try_get(0usize).map_err(db_err)
    }

    fn first_opt_text(&self) -> Result<Option<String>, StoreError> {
        match self.try_get::<Option<String>, _>(0usize) {
            Ok(s) => Ok(s),
            Err(_) => self.try_get::<Option<Vec<u8>>, _>(0usize).map_err(db_err)?.map(|b| utf8("0", b)).transpose(),
        }
    }
}

/// A transaction: queries run in it, and it ends with [`Tx::commit`] or,
/// dropped, rolls back.
pub(crate) struct Tx<'c, DB: Driver>(sqlx::Transaction<'c, DB>);

impl<'c, DB: Driver> Tx<'c, DB> {
    /// Begins a transaction on `conn`, with the dialect's statement if it has one.
    pub(crate) async fn begin(conn: &'c mut DB::Connection, statement: Option<&'static str>) -> Result<Self, StoreError> {
        let tx = match statement {
            Some(begin) => sqlx::Connection::begin_with(conn, begin).await,
            None => sqlx::Connection::begin(conn).await,
        };
        tx.map(Tx).map_err(db_err)
    }

    /// The transaction's connection, for statements run as they are.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self.0
    }

    pub(crate) async fn commit(self) -> Result<(), StoreError> {
        self.0.commit().await.map_err(db_err)
    }

    pub(crate) async fn rollback(self) -> Result<(), StoreError> {
        self.0.rollback().await.map_err(db_err)
    }

    /// Runs a statement; the number of rows it changed.
    pub(crate) async fn execute(&mut self, q: Query) -> Result<u64, StoreError> {
        DB::execute(&mut *self.0, &q).await.map_err(db_err)
    }

    /// Runs a statement as it is, without turning its error into a
    /// [`StoreError`] (for callers that look at the error).
    pub(crate) async fn try_execute(&mut self, q: Query) -> Result<u64, sqlx::Error> {
        DB::execute(&mut *self.0, &q).await
    }

    pub(crate) async fn fetch_all(&mut self, q: Query) -> Result<Vec<DB::Row>, StoreError> {
        DB::fetch_all(&mut *self.0, &q).await.map_err(db_err)
    }

    pub(crate) async fn fetch_optional(&mut self, q: Query) -> Result<Option<DB::Row>, StoreError> {
        DB::fetch_optional(&mut *self.0, &q).await.map_err(db_err)
    }

    /// The query's one row; its absence is an error.
    pub(crate) async fn fetch_one(&mut self, q: Query) -> Result<DB::Row, StoreError> {
        match DB::fetch_optional(&mut *self.0, &q).await.map_err(db_err)? {
            Some(row) => Ok(row),
            None => Err(StoreError::Backend(format!("no row from `{}`", q.sql()))),
        }
    }
}
