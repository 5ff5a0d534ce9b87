//! A statement and its parameters, rendered for one [`Dialect`] as it is
//! built: the one place where SQL text meets a dialect.

use std::fmt::Write;

use super::dialect::Dialect;

/// One bound value. The SQL stores keep integers, flags (0/1) and text only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Param {
    fn from(v: i64) -> Self {
        Param::Int(Some(v))
    }
}

impl From<Option<i64>> for Param {
    fn from(v: Option<i64>) -> Self {
        Param::Int(v)
    }
}

impl From<u32> for Param {
    fn from(v: u32) -> Self {
        Param::Int(Some(i64::from(v)))
    }
}

impl From<bool> for Param {
    fn from(v: bool) -> Self {
        Param::Int(Some(i64::from(v)))
    }
}

impl From<&str> for Param {
    fn from(v: &str) -> Self {
        Param::Text(Some(v.to_string()))
    }
}

impl From<&String> for Param {
    fn from(v: &String) -> Self {
        Param::Text(Some(v.clone()))
    }
}

impl From<String> for Param {
    fn from(v: String) -> Self {
        Param::Text(Some(v))
    }
}

impl From<Option<String>> for Param {
    fn from(v: Option<String>) -> Self {
        Param::Text(v)
    }
}

impl From<Option<&str>> for Param {
    fn from(v: Option<&str>) -> Self {
        Param::Text(v.map(str::to_string))
    }
}

/// A statement for one dialect. Text given to [`Query::new`] and
/// [`Query::push`] writes each placeholder as `?`, bound in order with
/// [`Query::bind`]; [`Query::push_bind`] and [`Query::push_list`] write
/// their own. Placeholders come out as the dialect spells them.
#[derive(Debug, Clone)]
pub struct Query {
    dialect: &'static Dialect,
    sql: String,
    params: Vec<Param>,
    /// Placeholders written so far.
    placeholders: usize,
    /// Prepared once per connection and kept (the driver's statement
    /// cache); off for statements whose text varies with a batch's size.
    persistent: bool,
}

impl Query {
    pub(crate) fn new(dialect: &'static Dialect, sql: &str) -> Self {
        let q = Query { dialect, sql: String::with_capacity(sql.len() + 16), params: Vec::new(), placeholders: 0, persistent: true };
        q.push(sql)
    }

    /// Appends text, its `?` placeholders rendered for the dialect.
    pub(crate) fn push(mut self, sql: &str) -> Self {
        let mut parts = sql.split('?');
        self.sql.push_str(parts.next().unwrap_or_default());
        for part in parts {
            self.placeholder();
            self.sql.push_str(part);
        }
        self
    }

    /// Binds the next `?` of the text.
    pub(crate) fn bind(mut self, value: impl Into<Param>) -> Self {
        self.params.push(value.into());
        self
    }

    /// Appends a placeholder and binds it.
    pub(crate) fn push_bind(mut self, value: impl Into<Param>) -> Self {
        self.placeholder();
        self.bind(value)
    }

    /// Appends `?, ?, …`, one bound placeholder per item.
    pub(crate) fn push_list<P: Into<Param>>(mut self, items: impl IntoIterator<Item = P>) -> Self {
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.sql.push_str(", ");
            }
            self = self.push_bind(item);
        }
        self
    }

    /// Appends the dialect's locking clause (`FOR UPDATE`, or nothing where
    /// a write transaction holds the database's write lock).
    pub(crate) fn for_update(mut self) -> Self {
        self.sql.push_str(self.dialect.for_update);
        self
    }

    /// Appends the dialect's insert-or-ignore clause for a table keyed by `key`.
    pub(crate) fn or_ignore(self, key: &str) -> Self {
        let clause = self.dialect.ignore_suffix.replace("{key}", key);
        self.push(&clause)
    }

    /// Not kept in the driver's statement cache: for text built per batch.
    pub(crate) fn once(mut self) -> Self {
        self.persistent = false;
        self
    }

    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    pub(crate) fn params(&self) -> &[Param] {
        &self.params
    }

    pub(crate) fn persistent(&self) -> bool {
        self.persistent
    }

    /// Whether every placeholder has a value: a statement that fails this
    /// is a bug of the code that built it, caught before the database sees it.
    pub(crate) fn is_complete(&self) -> bool {
        self.placeholders == self.params.len()
    }

    fn placeholder(&mut self) {
        self.placeholders += 1;
        if self.dialect.numbered {
            let _ = write!(self.sql, "${}", self.placeholders);
        } else {
            self.sql.push('?');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NUMBERED: Dialect = Dialect { numbered: true, for_update: " FOR UPDATE", ..crate::sql::dialect::tests::PLAIN };
    const PLAIN: Dialect = crate::sql::dialect::tests::PLAIN;

    #[test]
    fn placeholders_are_numbered_in_order_across_pushes() {
        let q =
            Query::new(&NUMBERED, "a = ? AND b = ?").bind(1i64).bind("x").push(" AND c IN (").push_list([3i64, 4]).push(")").for_update();
        assert_eq!(q.sql(), "a = $1 AND b = $2 AND c IN ($3, $4) FOR UPDATE");
        assert_eq!(q.params(), &[Param::from(1i64), Param::from("x"), Param::from(3i64), Param::from(4i64)]);
        assert!(q.is_complete());
    }

    #[test]
    fn plain_placeholders_and_no_locking_clause() {
        let q = Query::new(&PLAIN, "a = ?").bind(None::<i64>).for_update().or_ignore("id");
        assert_eq!(q.sql(), "a = ? ON CONFLICT DO NOTHING");
        assert!(q.is_complete());
        assert!(!Query::new(&PLAIN, "a = ? AND b = ?").bind(1i64).is_complete());
    }
}
