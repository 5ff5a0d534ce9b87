//! Validation errors for user input. Each carries a stable `code` that the API
//! returns verbatim, and the field it concerns.

/// A precise, user-facing validation error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// Stable machine-readable code, e.g. `invalid_cron`.
    pub code: &'static str,
    /// Dotted path of the offending field, e.g. `schedule.cron`.
    pub field: String,
    /// What is wrong with the field, for a person (without the field's
    /// path: the `Display` form prefixes it).
    pub message: String,
}

impl SpecError {
    /// An error with the given code, field path and message.
    pub fn new(code: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code, field: field.into(), message: message.into() }
    }
}
