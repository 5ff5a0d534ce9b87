//! The limits of job JSON as JSON Schema, for the OpenAPI document: one
//! type per kind of value whose rule is more than its JSON type (names,
//! durations, instants, cron expressions, …). A field names its kind with
//! `#[schema(value_type = …)]` where it is declared, and the kind's schema
//! is built here from the same constants the validation uses.
//!
//! Where a rule cannot be written in JSON Schema (a value's meaning, a
//! rule between two fields), the pattern admits a subset of what the
//! server accepts, chosen so that every value it admits is accepted, and
//! the description states the whole rule. A normalised value (what a job
//! read back holds) stays within its pattern. The tests at the end check
//! each pattern against the validation code.

use std::borrow::Cow;

use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

/// The characters of a name after its first: letters, digits, `_`, `.`, `-`.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]*$";
/// A parameter's name.
pub const PARAM_NAME_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_]*$";
/// An HTTP header name (an RFC 9110 token).
pub const HEADER_NAME_PATTERN: &str = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$";
/// A string without NUL.
pub const NO_NUL_PATTERN: &str = "^[^\\x00]*$";
/// An `Idempotency-Key`: 1 to 255 visible ASCII characters, spaces inside.
pub const IDEMPOTENCY_KEY_PATTERN: &str = "^[!-~](?:[ -~]*[!-~])?$";
/// The longest JSON pointer a webhook trigger maps, in bytes (checked in
/// `triggers::validate`; the tests hold the two together).
const MAX_POINTER_LEN: usize = 1024;
/// The longest `secret_env`, in bytes (likewise).
const MAX_SECRET_ENV_LEN: usize = 128;
/// The characters a pattern built by [`avoiding`] may use.
#[derive(Clone, Copy)]
pub enum Alphabet {
    /// Any character but these.
    Except(&'static str),
    /// Only these (ASCII).
    Only(&'static str),
}

/// `c` as it may stand in a character class.
fn class_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '^' | '-' => format!("\\{c}"),
        '\0' => "\\x00".to_string(),
        c => c.to_string(),
    }
}

impl Alphabet {
    /// The class of the alphabet's characters but `minus`.
    fn class(self, minus: &[char]) -> String {
        match self {
            Alphabet::Except(base) => format!("[^{}]", base.chars().chain(minus.iter().copied()).map(class_char).collect::<String>()),
            Alphabet::Only(set) => format!("[{}]", set.chars().filter(|c| !minus.contains(c)).map(class_char).collect::<String>()),
        }
    }

    fn has(self, c: char) -> bool {
        match self {
            Alphabet::Except(base) => !base.contains(c),
            Alphabet::Only(set) => set.contains(c),
        }
    }
}

/// A pattern for the non-empty strings of `alphabet` that are none of
/// `words` and start with none of `prefixes` (in any case of their ASCII
/// letters when `any_case`), written without lookahead: a trie of the
/// refused strings, each of its nodes admitting any character that leaves
/// the trie.
pub fn avoiding(alphabet: Alphabet, words: &[&str], prefixes: &[&str], any_case: bool) -> String {
    struct Refused {
        alphabet: Alphabet,
        words: Vec<String>,
        prefixes: Vec<String>,
        any_case: bool,
    }
    impl Refused {
        fn node(&self, at: &str) -> String {
            let mut next: Vec<char> = self.words.iter().chain(&self.prefixes).filter_map(|w| w.strip_prefix(at)?.chars().next()).collect();
            next.sort_unstable();
            next.dedup();
            let mut leaving = Vec::new();
            for c in &next {
                leaving.push(*c);
                if self.any_case && c.is_ascii_alphabetic() {
                    leaving.push(c.to_ascii_uppercase());
                }
            }
            let mut branches = Vec::new();
            if !at.is_empty() && !self.words.iter().any(|w| w == at) {
                branches.push(String::new());
            }
            branches.push(format!("{}{}*", self.alphabet.class(&leaving), self.alphabet.class(&[])));
            for c in next {
                let deeper = format!("{at}{c}");
                if self.prefixes.contains(&deeper) || !self.alphabet.has(c) {
                    continue;
                }
                let letter = if self.any_case && c.is_ascii_alphabetic() {
                    format!("[{}{}]", c, c.to_ascii_uppercase())
                } else {
                    format!("[{}]", class_char(c))
                };
                branches.push(format!("{letter}{}", self.node(&deeper)));
            }
            format!("(?:{})", branches.join("|"))
        }
    }
    let fold = |v: &[&str]| v.iter().map(|w| if any_case { w.to_ascii_lowercase() } else { w.to_string() }).collect();
    let refused = Refused { alphabet, words: fold(words), prefixes: fold(prefixes), any_case };
    format!("^{}$", refused.node(""))
}
fn string(pattern: impl Into<String>, description: &str) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).pattern(Some(pattern.into())).description(Some(description))
}

macro_rules! kind {
    ($(#[$doc:meta])* $name:ident, $schema:expr) => {
        $(#[$doc])*
        pub struct $name;
        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ($schema).into()
            }
        }
        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

kind!(
    /// A job, handler or upstream name.
    Name,
    string(NAME_PATTERN, "1 to 128 letters, digits, `_`, `.` or `-`, starting with a letter or digit.")
        .min_length(Some(1))
        .max_length(Some(crate::spec::MAX_NAME_LEN))
);
kind!(
    /// A namespace.
    Namespace,
    string(NAME_PATTERN, "1 to 64 letters, digits, `_`, `.` or `-`, starting with a letter or digit.")
        .min_length(Some(1))
        .max_length(Some(crate::spec::MAX_NAMESPACE_LEN))
);
kind!(
    /// A parameter's name.
    ParamName,
    string(
        PARAM_NAME_PATTERN,
        "1 to 64 letters, digits or `_`, starting with a letter or `_`; the names of one job differ also in upper case.",
    )
    .min_length(Some(1))
    .max_length(Some(crate::params::MAX_PARAM_NAME))
);

// Durations, as humantime writes them with the spaces left out (the
// normalised form): components from months down to milliseconds, each
// below the next unit up. Every pattern below admits only values in its
// field's range, and the normalised form of each value it admits.
const MONTHS: &str = "(?:1month|(?:[2-9]|10)months)";
const DAYS: &str = "(?:1day|(?:[2-9]|[12][0-9]|30)days)";
const HOURS: &str = "(?:[1-9]|1[0-9]|2[0-3])h";
const MINUTES: &str = "(?:[1-9]|[1-5][0-9])m";
const SECONDS: &str = "(?:[1-9]|[1-5][0-9])s";
const MILLIS: &str = "(?:[1-9][0-9]{0,2})ms";
/// 11 months and at most 13 hours more: what 10 months and 31 days
/// normalise to (a month is 30.44 days).
const ELEVEN_MONTHS: &str = "11months(?:(?:[1-9]|1[0-3])h)?(?:(?:[1-9]|[1-5][0-9])m)?(?:(?:[1-9]|[1-5][0-9])s)?(?:[1-9][0-9]{0,2}ms)?";

/// `parts` in order, each optional, at least one of them.
fn ordered(parts: &[&str]) -> String {
    let branches: Vec<String> = (0..parts.len())
        .map(|first| {
            let rest: String = parts[first + 1..].iter().map(|p| format!("(?:{p})?")).collect();
            format!("{}{rest}", parts[first])
        })
        .collect();
    format!("(?:{})", branches.join("|"))
}

fn anchored(alternatives: &[String]) -> String {
    format!("^(?:{})$", alternatives.join("|"))
}

/// 1ms up to (not including) a year.
pub fn duration_pattern() -> String {
    anchored(&[ordered(&[MONTHS, DAYS, HOURS, MINUTES, SECONDS, MILLIS]), ELEVEN_MONTHS.into()])
}

/// 1 minute up to a year.
pub fn minute_or_more_pattern() -> String {
    anchored(&[format!("{}(?:{SECONDS})?(?:{MILLIS})?", ordered(&[MONTHS, DAYS, HOURS, MINUTES])), ELEVEN_MONTHS.into()])
}

/// 100ms up to a year.
pub fn every_pattern() -> String {
    anchored(&[
        format!("{}(?:{MILLIS})?", ordered(&[MONTHS, DAYS, HOURS, MINUTES, SECONDS])),
        "[1-9][0-9]{2}ms".into(),
        ELEVEN_MONTHS.into(),
    ])
}

/// 1ms up to (not including) a minute.
pub fn under_minute_pattern() -> String {
    anchored(&[ordered(&[SECONDS, MILLIS])])
}

/// 1ms up to a minute.
pub fn up_to_minute_pattern() -> String {
    anchored(&[ordered(&[SECONDS, MILLIS]), "1m".into()])
}

/// 1s up to 7 days (a notification's `late_after`).
pub fn late_after_pattern() -> String {
    anchored(&[format!("{}(?:{MILLIS})?", ordered(&["(?:1day|[2-6]days)", HOURS, MINUTES, SECONDS])), "7days".into()])
}

/// 100ms up to 60s (a notification's `timeout`).
pub fn delivery_timeout_pattern() -> String {
    anchored(&[format!("{SECONDS}(?:{MILLIS})?"), "[1-9][0-9]{2}ms".into(), "1m".into()])
}

const DURATION_TEXT: &str = "A duration written as the server writes it: components from months down to milliseconds, in \
    that order, without spaces, e.g. `30s`, `1m30s`, `2h`, `1day12h`, `250ms` (`month`, `day` singular for 1). The server \
    also reads other spellings (`90s`, `1h 30m`, `2d`) and writes them back in this form.";

kind!(
    /// A job's `timeout`: 1ms up to a year.
    Timeout,
    string(duration_pattern(), &format!("{DURATION_TEXT} From 1ms; up to a year (the server accepts up to 366 days)."))
);
kind!(
    /// A job's `catchup_window`.
    CatchupWindow,
    string(
        minute_or_more_pattern(),
        &format!(
            "{DURATION_TEXT} From 1m; up to a year. The server accepts 1ms to 366 days, longer than the schedule's \
             `jitter`; from 1m it is longer than any jitter this document admits."
        ),
    )
);
kind!(
    /// `schedule.every`: 100ms up to a year.
    Every,
    string(every_pattern(), &format!("{DURATION_TEXT} From 100ms; up to a year (the server accepts up to 366 days)."))
);
kind!(
    /// `schedule.jitter`.
    Jitter,
    string(
        under_minute_pattern(),
        &format!(
            "{DURATION_TEXT} Below 1m. The server accepts 1ms to 1h, shorter than the job's `catchup_window` \
             (default 1h)."
        ),
    )
);
kind!(
    /// `retry.backoff.initial`.
    BackoffInitial,
    string(
        up_to_minute_pattern(),
        &format!(
            "{DURATION_TEXT} 1ms to 1m. The server accepts 1ms to 366 days, at most `max` (default 1m); up to 1m it \
             is at most any `max` this document admits."
        ),
    )
);
kind!(
    /// `retry.backoff.max`.
    BackoffMax,
    string(
        minute_or_more_pattern(),
        &format!(
            "{DURATION_TEXT} From 1m; up to a year. The server accepts 1ms to 366 days, at least `initial` (default \
             1s); from 1m it is at least any `initial` this document admits."
        ),
    )
);
kind!(
    /// A notification's `late_after`: 1s to 7 days.
    LateAfter,
    string(late_after_pattern(), &format!("{DURATION_TEXT} 1s to 7 days."))
);
kind!(
    /// A notification delivery's `timeout`: 100ms to 60s.
    DeliveryTimeout,
    string(delivery_timeout_pattern(), &format!("{DURATION_TEXT} 100ms to 60s."))
);

/// An RFC 3339 instant from 1970 to 2999 with a valid calendar date and
/// no leap second; any offset, except on the range's first and last
/// years, which take `Z` (so that an instant normalised to UTC stays in
/// the range).
pub fn instant_pattern() -> String {
    let day_of_month =
        "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
    let inner_years = "(?:19(?:7[1-9]|[89][0-9])|2[0-8][0-9]{2}|29[0-8][0-9]|299[0-8])";
    let leap_years = "(?:19(?:7[26]|8[048]|9[26])|2[0-9](?:0[48]|[2468][048]|[13579][26])|2000|2400)";
    let time = "T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?";
    let offset = "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    anchored(&[
        format!("(?:{inner_years}-{day_of_month}|{leap_years}-02-29){time}{offset}"),
        format!("(?:1970|2999)-{day_of_month}{time}Z"),
    ])
}

kind!(
    /// An instant: RFC 3339.
    Instant,
    string(
        instant_pattern(),
        "An RFC 3339 instant, e.g. `2027-01-04T09:00:00+01:00`; read back in UTC with milliseconds \
         (`2027-01-04T08:00:00.000Z`). This document admits the years 1970 to 2999 (the first and last with `Z`).",
    )
    .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::DateTime)))
);

/// Cron expressions this document admits: 5 or 6 fields (seconds first)
/// of `*`, a number or `*/step`, days of the month up to 28 so every
/// expression matches real dates; or a macro.
pub fn cron_pattern() -> String {
    let sixty = "(?:\\*|[0-9]|[1-5][0-9]|\\*/(?:[1-9]|[1-5][0-9]))";
    let hour = "(?:\\*|[0-9]|1[0-9]|2[0-3]|\\*/(?:[1-9]|1[0-9]|2[0-3]))";
    let day = "(?:\\*|[1-9]|1[0-9]|2[0-8]|\\*/(?:[1-9]|1[0-9]|2[0-8]))";
    let month = "(?:\\*|[1-9]|1[0-2])";
    let weekday = "(?:\\*|[0-6])";
    anchored(&[format!("(?:{sixty} )?{sixty} {hour} {day} {month} {weekday}"), "@(?:yearly|annually|monthly|weekly|daily|hourly)".into()])
}

kind!(
    /// `schedule.cron`.
    CronExpression,
    string(
        cron_pattern(),
        "A cron expression on the wall clock of `timezone`: 6 fields (seconds first) or 5 (seconds 0). The server \
         accepts the whole cron syntax (lists, ranges, steps, names, `L`, `W`, `#`, `?`, `@hourly`-style macros) up to \
         256 characters, when the expression matches some real date; this document admits `*`, single numbers and \
         `*/step` in each field (days of the month 1 to 28), and the macros.",
    )
    .max_length(Some(256))
);

kind!(
    /// `schedule.timezone`: an IANA zone.
    TimeZone,
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some("An IANA time zone, e.g. `Europe/Berlin` or `UTC`."))
        .enum_values(Some(chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name())))
);

/// Memory sizes this document admits: 1 to 9,999,999 of `M`, `G` or `T`
/// (any case, with or without `iB`/`B`), or 8 to 19 digits of bytes.
pub const MEMORY_PATTERN: &str = "^(?:[1-9][0-9]{0,6}[MmGgTt](?:[Ii]?[Bb])?|[1-9][0-9]{7,18})$";

kind!(
    /// `executor.shell.limits.memory`.
    MemorySize,
    string(
        MEMORY_PATTERN,
        "A size: bytes, or a number with `K`, `M`, `G` or `T` (powers of 1024; `KiB`, `KB` and `k` mean the same), \
         at least 1MiB. This document admits 1 to 9999999 `M`, `G` or `T`, or 10,000,000 bytes and more.",
    )
);

/// HTTP URLs this document admits: `http` or `https`, a host name whose
/// last label starts with a letter (or an IPv4 address), an optional port
/// and path and query of URL characters.
pub fn url_pattern() -> String {
    let label = "[a-z0-9]+(?:-[a-z0-9]+)*";
    let last = "[a-z][a-z0-9]*(?:-[a-z0-9]+)*";
    let octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let port = "(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
    let chars = "[A-Za-z0-9._~!$&'()*+,;=:@%/-]";
    anchored(&[format!("https?://(?:(?:{label}\\.)*{last}|{octet}(?:\\.{octet}){{3}})(?::{port})?(?:/{chars}*)?(?:\\?{chars}*)?")])
}

const URL_TEXT: &str = "An `http://` or `https://` URL with a host. This document admits host names whose last label \
    starts with a letter, IPv4 addresses, ports 1 to 65535 and paths and queries of URL characters.";

kind!(
    /// An HTTP job's URL.
    HttpUrl,
    string(url_pattern(), URL_TEXT)
);
kind!(
    /// A notification target's URL (at most 2048 bytes).
    NotifyUrl,
    string(url_pattern(), &format!("{URL_TEXT} At most 2048 bytes.")).max_length(Some(crate::notify::MAX_URL_LEN))
);

kind!(
    /// An HTTP job's method.
    HttpMethod,
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some("The request method, in capitals (default `GET`)."))
        .enum_values(Some(crate::spec::HTTP_METHODS.iter().copied()))
);
kind!(
    /// Text without NUL (a shell job's arguments, environment, directory).
    NoNul,
    string(NO_NUL_PATTERN, "Any text without NUL.")
);
kind!(
    /// A shell job's environment variable name.
    EnvName,
    string(
        avoiding(Alphabet::Except("=\0"), &[], &["GNOMON_"], false),
        "A variable name: not empty, without `=` or NUL, not starting with `GNOMON_` (gnomon sets those).",
    )
);
kind!(
    /// An HTTP job's request header name.
    HeaderName,
    string(HEADER_NAME_PATTERN, "A header name (an HTTP token).")
);
kind!(
    /// An HTTP job's request header value.
    HeaderValue,
    string("^[^\\r\\n\\x00]*$", "A header value, without CR, LF or NUL.")
);
kind!(
    /// A `route.labels` key.
    LabelKey,
    string(".", "1 to 63 characters.").pattern(None::<String>).min_length(Some(1)).max_length(Some(crate::spec::MAX_LABEL_LEN))
);
kind!(
    /// A `route.labels` value.
    LabelValue,
    string(".", "At most 63 characters.").pattern(None::<String>).max_length(Some(crate::spec::MAX_LABEL_LEN))
);
kind!(
    /// A notification signing secret's name.
    SecretName,
    string(
        "^[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*_?$",
        "1 to 64 letters, digits or `_`, not starting with `_` and without `__`: a secret of the job's own namespace.",
    )
    .min_length(Some(1))
    .max_length(Some(crate::notify::MAX_SECRET_NAME))
);
kind!(
    /// A notification webhook's extra header name.
    NotifyHeaderName,
    string(
        avoiding(
            Alphabet::Only("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
            &crate::notify::RESERVED_HEADERS,
            &[crate::notify::RESERVED_HEADER_PREFIX],
            true,
        ),
        "A header name (an HTTP token) of 1 to 128 characters, in any case none of `Content-Type`, \
         `Content-Length`, `Host`, `Transfer-Encoding`, and not starting with `Gnomon-` (gnomon sets those).",
    )
    .max_length(Some(crate::notify::MAX_HEADER_NAME))
);
kind!(
    /// A notification webhook's extra header value.
    NotifyHeaderValue,
    string(
        "^[^\\x00-\\x1f\\x7f-\\x9f]*$",
        "A header value without control characters, at most 1024 bytes of UTF-8 (this document admits 256 characters).",
    )
    .max_length(Some(crate::notify::MAX_HEADER_VALUE / 4))
);
kind!(
    /// A JSON pointer into a webhook payload.
    JsonPointer,
    string(
        "^(?:/[\\s\\S]*)?$",
        "A JSON pointer (RFC 6901): empty for the whole payload, or `/`-separated names such as `/repository/name`; \
         at most 1024 bytes (this document admits 256 characters).",
    )
    .max_length(Some(MAX_POINTER_LEN / 4))
);
kind!(
    /// The variable that holds a webhook trigger's secret.
    HookSecretEnv,
    string(
        format!("^{}[A-Z0-9_]+$", crate::triggers::HOOK_SECRET_PREFIX),
        "An environment variable of every server: `GNOMON_HOOK_SECRET_` and capitals, digits or `_`, at most 128 bytes.",
    )
    .max_length(Some(MAX_SECRET_ENV_LEN))
);
kind!(
    /// A parameter's value: any JSON, a string without NUL.
    ParamValue,
    utoipa::openapi::schema::AnyOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::Null,
            Type::Boolean,
            Type::Number,
            Type::Object,
            Type::Array,
        ])))
        .item(string(NO_NUL_PATTERN, "A string without NUL."))
        .description(Some("Any JSON value; a string holds no NUL (shell jobs see it in their environment)."))
);

mod rules;
#[cfg(test)]
mod tests;

pub use rules::{refine, JobUpdate};
