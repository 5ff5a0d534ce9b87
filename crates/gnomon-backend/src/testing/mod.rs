//! What backend tests share: the conformance suites and throwaway databases.

pub mod conformance;
#[cfg(all(feature = "mysql", feature = "postgres"))]
pub mod testdb;
