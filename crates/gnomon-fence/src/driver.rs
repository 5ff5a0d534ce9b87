//! What the statements need of a sqlx driver: running one with its
//! parameters bound, and reading the rows they return. [`Driver`] is
//! implemented once, for every driver that has what it needs, so the
//! statements are generic over the database without naming sqlx's trait
//! bounds.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::dialect::StepRow;
use crate::BoxFuture;

/// A statement's parameter.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Text(&'a str),
    Int(i64),
}

/// The number of rows a statement changed (sqlx has no trait for it).
pub trait RowsAffected {
    fn rows(&self) -> u64;
}

#[cfg(feature = "postgres")]
impl RowsAffected for sqlx::postgres::PgQueryResult {
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

/// A sqlx database the statements run on.
pub trait Driver: Database {
    /// Runs SQL text as it is, unprepared (one or more statements).
    fn raw<'a>(conn: &'a mut Self::Connection, sql: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    /// Runs a statement; the number of rows it changed.
    fn execute<'a>(conn: &'a mut Self::Connection, sql: &'a str, args: &'a [Arg<'a>]) -> BoxFuture<'a, Result<u64, sqlx::Error>>;
    /// Runs a query of one row, read as `(attempt, token)`.
    fn fetch_run<'a>(conn: &'a mut Self::Connection, sql: &'a str, args: &'a [Arg<'a>]) -> BoxFuture<'a, Result<(i64, i64), sqlx::Error>>;
    /// Runs a query of at most one row, read as a step's record.
    fn fetch_step<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> BoxFuture<'a, Result<Option<StepRow>, sqlx::Error>>;
}

/// The statement with its parameters bound, as sqlx takes it.
fn bound<'q, DB>(sql: &'q str, args: &[Arg<'q>]) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    i64: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
{
    args.iter().fold(sqlx::query(sql), |q, arg| match *arg {
        Arg::Text(v) => q.bind(v),
        Arg::Int(v) => q.bind(v),
    })
}

impl<DB> Driver for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> (i64, i64): FromRow<'r, DB::Row>,
    for<'r> StepRow: FromRow<'r, DB::Row>,
    DB::QueryResult: RowsAffected,
{
    fn raw<'a>(conn: &'a mut DB::Connection, sql: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { conn.execute(sqlx::raw_sql(sql)).await.map(|_| ()) })
    }

    fn execute<'a>(conn: &'a mut DB::Connection, sql: &'a str, args: &'a [Arg<'a>]) -> BoxFuture<'a, Result<u64, sqlx::Error>> {
        Box::pin(async move { Ok(bound::<DB>(sql, args).execute(conn).await?.rows()) })
    }

    fn fetch_run<'a>(conn: &'a mut DB::Connection, sql: &'a str, args: &'a [Arg<'a>]) -> BoxFuture<'a, Result<(i64, i64), sqlx::Error>> {
        Box::pin(async move {
            let row = bound::<DB>(sql, args).fetch_one(conn).await?;
            <(i64, i64)>::from_row(&row)
        })
    }

    fn fetch_step<'a>(
        conn: &'a mut DB::Connection,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> BoxFuture<'a, Result<Option<StepRow>, sqlx::Error>> {
        Box::pin(async move {
            let row = bound::<DB>(sql, args).fetch_optional(conn).await?;
            row.map(|row| StepRow::from_row(&row)).transpose()
        })
    }
}
