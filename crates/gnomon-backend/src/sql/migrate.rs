//! A minimal migration runner shared by the SQL backends: numbered scripts
//! applied once, in order, recorded in `gnomon_migrations`.

#[derive(Debug)]
pub struct Migration {
    pub version: i64,
    pub statements: &'static [&'static str],
}
