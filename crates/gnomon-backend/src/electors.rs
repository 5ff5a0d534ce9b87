//! The factory above the backends it picks: which database-lock elector
//! goes with a store URL. It sits here, not in `election/`, so the generic
//! lock elector knows nothing of the MySQL and PostgreSQL locks that plug
//! into it.

use std::sync::Arc;

use crate::election::{DbLockElector, ElectionConfig, LockConnector};
use crate::{ElectionError, Store};

/// The database-lock elector that goes with a store URL: `GET_LOCK` for
/// `mysql://`, an advisory lock for `postgres://`; `None` for other stores.
/// Probes the lock once, so a user who may not take it is told at start.
pub async fn lock_elector_for(url: &str, store: Arc<dyn Store>, config: ElectionConfig) -> Result<Option<DbLockElector>, ElectionError> {
    let connector: Arc<dyn LockConnector> = if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        #[cfg(feature = "mysql")]
        {
            Arc::new(crate::mysql::lock::MySqlLock::new(url, config.ttl)?)
        }
        #[cfg(not(feature = "mysql"))]
        return Err(ElectionError::Refused("the mysql backend is not compiled into this build".into()));
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            Arc::new(crate::postgres::lock::PgLock::new(url, config.ttl)?)
        }
        #[cfg(not(feature = "postgres"))]
        return Err(ElectionError::Refused("the postgres backend is not compiled into this build".into()));
    } else {
        return Ok(None);
    };
    let elector = DbLockElector::new(connector, store, config);
    elector.probe().await?;
    Ok(Some(elector))
}
