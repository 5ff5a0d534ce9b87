//! Durations as written in job JSON: strings such as `"30s"`, `"1m30s"`, `"250ms"`.

use std::time::Duration;

/// Parses a human duration. Negative, empty or malformed values are errors.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("empty duration".into());
    }
    if trimmed.starts_with('-') {
        return Err(format!("negative duration {trimmed:?}"));
    }
    humantime::parse_duration(trimmed).map_err(|e| format!("malformed duration {trimmed:?}: {e} (use e.g. \"30s\", \"5m\", \"250ms\")"))
}

/// Renders a duration the way job JSON writes it (`"1m 30s"` style collapsed to `"1m30s"`).
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    humantime::format_duration(d).to_string().replace(' ', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }
}
