//! How a driver's errors become [`StoreError`]s (and whether retrying
//! may help), and the explanations given at start-up.

use crate::StoreError;

/// Maps a driver error to a [`StoreError`], saying whether a retry may help.
/// How a lost connection's error begins. A write that meets it has an
/// unknown outcome (the connection may have gone during the commit).
pub(crate) const CONNECTION_LOST: &str = "connection lost: ";

pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => StoreError::Unavailable(format!("{CONNECTION_LOST}{e}")),
        // PostgreSQL ended the session: idle in a transaction or idle past
        // the timeouts, an administrator, a shutdown.
        sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("25P03" | "57P01" | "57P02" | "57P05" | "08003" | "08006")) => {
            StoreError::Unavailable(format!("{CONNECTION_LOST}{e}"))
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(d) => {
            let code = d.code().map(|c| c.to_string()).unwrap_or_default();
            let msg = d.message();
            // Serialization failure, deadlock, lock or statement timeout:
            // the transaction was rolled back and may be retried.
            if matches!(code.as_str(), "40001" | "40P01" | "55P03" | "57014" | "57P01" | "5" | "6")
                || msg.contains("database is locked")
                || msg.contains("Lock wait timeout")
                || msg.contains("Deadlock found")
                || msg.contains("max_statement_time")
                || msg.contains("maximum statement execution time")
            {
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Backend(e.to_string())
            }
        }
        _ => StoreError::Backend(e.to_string()),
    }
}

pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

/// Explains a failure to connect or to use the database, for start-up.
pub(crate) fn explain_open_error(backend: &str, target: &str, e: sqlx::Error) -> StoreError {
    let text = e.to_string();
    let lower = text.to_lowercase();
    if let sqlx::Error::Database(d) = &e {
        let code = d.code().map(|c| c.to_string()).unwrap_or_default();
        if matches!(code.as_str(), "28P01" | "28000") || lower.contains("access denied for user") {
            return StoreError::Unavailable(format!(
                "{backend} at {target}: authentication failed (check the user and password in the URL): {text}"
            ));
        }
        if code == "3D000" || lower.contains("unknown database") {
            return StoreError::Unavailable(format!("{backend} at {target}: the database does not exist (create it first): {text}"));
        }
        if code == "42501" || lower.contains("command denied") || lower.contains("permission denied") {
            return StoreError::Backend(format!("{backend} at {target}: the database user lacks a privilege gnomon needs: {text}"));
        }
    }
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => {
            StoreError::Unavailable(format!("{backend} at {target} is unreachable (is it running, and is the address right?): {text}"))
        }
        sqlx::Error::Tls(_) => StoreError::Unavailable(format!("{backend} at {target}: TLS failed: {text}")),
        _ => StoreError::Unavailable(format!("{backend} at {target}: {text}")),
    }
}

/// The host:port part of a URL, without credentials, for messages.
pub(crate) fn redact(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(redact("mysql://root:secret@127.0.0.1:3306/test?ssl-mode=disabled"), "127.0.0.1:3306");
        assert_eq!(redact("postgres://127.0.0.1/test"), "127.0.0.1");
    }
}
