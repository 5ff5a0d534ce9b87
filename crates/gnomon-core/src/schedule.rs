//! Schedules: cron (with seconds, time zones and a defined DST policy),
//! fixed intervals on absolute time, one-shot times, and manual-only.
//!
//! # DST policy (cronie's rule)
//! Cron expressions are evaluated on the job's local wall clock. What a
//! time change does depends on the kind of expression:
//! - **Frequent** expressions, whose minute or hour field is a wildcard
//!   (`*`, `*/5`: they run every hour or more often), keep running on
//!   absolute time through a change: in a fall-back they fire in both
//!   passes of the repeated hour (`0 */5 * * * *` stays every five
//!   minutes), and wall-clock times inside a spring-forward gap, which do
//!   not exist, do not fire.
//! - **Fixed-time** expressions (a specific minute and hour, like
//!   `0 30 1 * * *`) fire once per matching wall-clock time: a time inside
//!   a spring-forward gap fires once, at the first instant after the gap
//!   (several gap times collapse into that one fire); a time repeated in a
//!   fall-back overlap fires once, at its first occurrence.
//! - `every` schedules run on absolute time (multiples of the interval since
//!   the Unix epoch) and ignore wall clocks entirely.

use chrono::{DateTime, Duration as ChronoDuration, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

pub use crate::jitter::Jitter;
use crate::{Millis, SpecError};

/// What a schedule's instants are, before its bounds: a cron expression,
/// an interval, one instant, or none.
#[derive(Debug, Clone)]
pub enum Rule {
    /// Fires when the cron expression matches the zone's wall clock, per
    /// the module's DST policy.
    Cron(Box<CronSchedule>),
    /// Fires at every multiple of `every_ms` since the Unix epoch.
    Every {
        /// The interval, in milliseconds (at least 100 in a compiled job;
        /// 0 or less never fires).
        every_ms: i64,
    },
    /// Fires once at the given instant.
    At {
        /// The instant, in milliseconds since the Unix epoch.
        at_ms: Millis,
    },
    /// Never fires by itself; manual triggers only.
    Manual,
}

/// A parsed, validated schedule: its rule's instants within its bounds
/// (`start_at` and `end_at`, both included; instants outside are not
/// instants of the schedule at all), each fired at its instant delayed
/// by its [`Jitter`].
#[derive(Debug, Clone)]
pub struct Schedule {
    rule: Rule,
    start_ms: Option<Millis>,
    end_ms: Option<Millis>,
    jitter: Option<Jitter>,
}

impl From<Rule> for Schedule {
    fn from(rule: Rule) -> Self {
        Self { rule, start_ms: None, end_ms: None, jitter: None }
    }
}

/// A parsed cron expression and the zone whose wall clock it is evaluated
/// on. Built only by [`CronSchedule::parse`], which rejects expressions
/// that never match.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    /// The expression as given, trimmed of surrounding whitespace.
    pub expression: String,
    /// The IANA zone the expression's wall-clock times are in.
    pub timezone: Tz,
    cron: croner::Cron,
    /// Its minute or hour field is a wildcard: it runs on absolute time
    /// through DST changes (see the module's DST policy).
    frequent: bool,
}

/// Whether a cron expression runs every hour or more often: its minute or
/// hour field is a wildcard (cronie's and Vixie cron's "wildcard job").
fn is_frequent(expression: &str) -> bool {
    if let Some(name) = expression.strip_prefix('@') {
        return name.eq_ignore_ascii_case("hourly");
    }
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let (minute, hour) = match fields.len() {
        6 => (fields[1], fields[2]),
        5 => (fields[0], fields[1]),
        _ => return false,
    };
    minute.starts_with('*') || hour.starts_with('*')
}

/// How many candidate wall-clock times we examine before declaring that a
/// cron expression does not fire (guards against pathological patterns).
const MAX_CRON_STEPS: usize = 100_000;

impl CronSchedule {
    /// Parses a 6-field (seconds first) or 5-field (seconds = 0) expression,
    /// or an `@hourly`-style macro, in the given IANA zone name.
    pub fn parse(expression: &str, timezone: &str) -> Result<Self, SpecError> {
        let tz: Tz = timezone
            .parse()
            .map_err(|_| SpecError::new("invalid_timezone", "schedule.timezone", format!("unknown IANA time zone {timezone:?}")))?;
        let trimmed = expression.trim();
        if trimmed.is_empty() {
            return Err(SpecError::new("invalid_cron", "schedule.cron", "empty cron expression"));
        }
        if trimmed.len() > 256 {
            return Err(SpecError::new("invalid_cron", "schedule.cron", "cron expression longer than 256 characters"));
        }
        let fields = trimmed.split_whitespace().count();
        if !(trimmed.starts_with('@') || fields == 5 || fields == 6) {
            return Err(SpecError::new(
                "invalid_cron",
                "schedule.cron",
                format!("cron expression {trimmed:?} has {fields} fields; expected 6 (seconds first) or 5"),
            ));
        }
        let cron = croner::Cron::new(trimmed)
            .with_seconds_optional()
            .parse()
            .map_err(|e| SpecError::new("invalid_cron", "schedule.cron", format!("invalid cron expression {trimmed:?}: {e}")))?;
        let schedule = Self { expression: trimmed.to_string(), timezone: tz, cron, frequent: is_frequent(trimmed) };
        // Reject expressions that can never fire (e.g. "0 0 0 30 2 *").
        let probe = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single().map(|d| d.timestamp_millis()).unwrap_or(0);
        if schedule.next_after(probe).is_none() {
            return Err(SpecError::new("invalid_cron", "schedule.cron", format!("cron expression {trimmed:?} never matches a real date")));
        }
        Ok(schedule)
    }

    /// Whether it runs on absolute time through DST changes (see the
    /// module's DST policy).
    pub fn is_frequent(&self) -> bool {
        self.frequent
    }

    /// Whether a local wall-clock time matches the expression itself.
    pub fn matches_wall_time(&self, naive: NaiveDateTime) -> bool {
        self.cron.is_time_matching(&Utc.from_utc_datetime(&naive)).unwrap_or(false)
    }

    /// The next fire instant strictly after `after_ms`, per the DST policy.
    pub fn next_after(&self, after_ms: Millis) -> Option<Millis> {
        if self.frequent {
            self.next_on_absolute_time(after_ms)
        } else {
            self.next_fixed_time(after_ms)
        }
    }

    /// A frequent expression: the first instant after `after_ms` whose local
    /// time (with the offset in force at that instant) matches. Walks one
    /// stretch of constant UTC offset at a time, so both passes of a
    /// repeated hour are seen and the times of a gap never match.
    fn next_on_absolute_time(&self, after_ms: Millis) -> Option<Millis> {
        let tz = &self.timezone;
        // Looking for t > from (or t >= from after crossing a transition).
        let mut from = after_ms;
        let mut inclusive = false;
        for _ in 0..MAX_OFFSET_STRETCHES {
            let offset = offset_ms(tz, from)?;
            let local_start = from + offset - i64::from(inclusive);
            let disguised = DateTime::<Utc>::from_timestamp_millis(local_start)?;
            let local_next = self.cron.find_next_occurrence(&disguised, false).ok()?.timestamp_millis();
            let candidate = local_next - offset;
            match first_offset_change(tz, from, candidate, offset) {
                None => return Some(candidate),
                Some(transition) => {
                    from = transition;
                    inclusive = true;
                }
            }
        }
        None
    }

    /// A fixed-time expression: the next matching wall-clock time, mapped
    /// to its first occurrence, or to the end of a gap.
    fn next_fixed_time(&self, after_ms: Millis) -> Option<Millis> {
        let after = DateTime::<Utc>::from_timestamp_millis(after_ms)?;
        // Cron fires on whole seconds; search from the local wall time of `after`.
        let mut naive = after.with_timezone(&self.timezone).naive_local();
        for _ in 0..MAX_CRON_STEPS {
            // croner walks a DST-free timeline when handed a UTC date-time, so
            // we feed it wall-clock time disguised as UTC and map back ourselves.
            let disguised = Utc.from_utc_datetime(&naive);
            let next_naive = self.cron.find_next_occurrence(&disguised, false).ok()?.naive_utc();
            let instant = resolve_local(&self.timezone, next_naive)?;
            if instant > after_ms {
                return Some(instant);
            }
            naive = next_naive;
        }
        None
    }
}

/// How many stretches of constant UTC offset a search crosses at most.
const MAX_OFFSET_STRETCHES: usize = 64;

/// The zone's UTC offset (local minus UTC) at an instant, in milliseconds.
fn offset_ms(tz: &Tz, instant_ms: Millis) -> Option<Millis> {
    let at = DateTime::<Utc>::from_timestamp_millis(instant_ms)?;
    Some(i64::from(tz.offset_from_utc_datetime(&at.naive_utc()).fix().local_minus_utc()) * 1000)
}

/// The first instant in `(from, until]` at which the zone's offset is no
/// longer `offset`, if any. Zones change their offset at most a few times a
/// year, never twice within six hours.
fn first_offset_change(tz: &Tz, from: Millis, until: Millis, offset: Millis) -> Option<Millis> {
    const STEP: Millis = 6 * 3600 * 1000;
    let differs = |t: Millis| offset_ms(tz, t).is_some_and(|o| o != offset);
    let mut lo = from;
    loop {
        let hi = (lo + STEP).min(until);
        if differs(hi) {
            // The change lies in (lo, hi]: binary search on milliseconds.
            let (mut a, mut b) = (lo, hi);
            while b - a > 1 {
                let mid = a + (b - a) / 2;
                if differs(mid) {
                    b = mid;
                } else {
                    a = mid;
                }
            }
            return Some(b);
        }
        if hi >= until {
            return None;
        }
        lo = hi;
    }
}

/// Maps a local wall-clock time to an instant: the first occurrence when it
/// is ambiguous, the end of the gap when it does not exist.
fn resolve_local(tz: &Tz, naive: NaiveDateTime) -> Option<Millis> {
    match tz.from_local_datetime(&naive) {
        chrono::LocalResult::Single(dt) => Some(dt.timestamp_millis()),
        chrono::LocalResult::Ambiguous(first, second) => Some(first.timestamp_millis().min(second.timestamp_millis())),
        chrono::LocalResult::None => gap_end(tz, naive),
    }
}

/// The transition instant that ends the DST gap containing `naive`.
fn gap_end(tz: &Tz, naive: NaiveDateTime) -> Option<Millis> {
    let as_utc = Utc.from_utc_datetime(&naive);
    let offset_at = |instant: DateTime<Utc>| i64::from(tz.offset_from_utc_datetime(&instant.naive_utc()).fix().local_minus_utc());
    // A zone never has two transitions within a day of each other.
    let before = offset_at(as_utc - ChronoDuration::hours(24));
    let after = offset_at(as_utc + ChronoDuration::hours(24));
    // The transition instant T lies in [naive - after, naive - before]; the
    // offset is `after` from T on. Binary search on whole seconds.
    let mut lo = as_utc.timestamp() - after.max(before);
    let mut hi = as_utc.timestamp() - after.min(before);
    let has_after_offset = |secs: i64| DateTime::<Utc>::from_timestamp(secs, 0).map(|d| offset_at(d) == after).unwrap_or(false);
    if !has_after_offset(hi) {
        return Some(hi * 1000);
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if has_after_offset(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo * 1000)
}

impl Rule {
    /// The next fire instant strictly after `after_ms`, or `None` when the
    /// schedule will not fire again.
    pub fn next_after(&self, after_ms: Millis) -> Option<Millis> {
        match self {
            Rule::Cron(cron) => cron.next_after(after_ms),
            Rule::Every { every_ms } => {
                let every = *every_ms;
                if every <= 0 {
                    return None;
                }
                let k = after_ms.div_euclid(every) + 1;
                k.checked_mul(every)
            }
            Rule::At { at_ms } => (*at_ms > after_ms).then_some(*at_ms),
            Rule::Manual => None,
        }
    }
}

impl Schedule {
    /// The schedule of a job that never fires by itself.
    pub fn manual() -> Self {
        Rule::Manual.into()
    }

    /// The same schedule with only the instants in `[start, end]` (either
    /// bound may be absent).
    pub fn bounded(mut self, start_ms: Option<Millis>, end_ms: Option<Millis>) -> Self {
        self.start_ms = start_ms;
        self.end_ms = end_ms;
        self
    }

    /// The same schedule with each instant's fire delayed by `jitter`.
    pub fn jittered(mut self, jitter: Option<Jitter>) -> Self {
        self.jitter = jitter;
        self
    }

    /// Its rule (what its instants are before the bounds).
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// Whether it never fires by itself.
    pub fn is_manual(&self) -> bool {
        matches!(self.rule, Rule::Manual)
    }

    /// Its bounds: the first and last instants it may have.
    pub fn bounds(&self) -> (Option<Millis>, Option<Millis>) {
        (self.start_ms, self.end_ms)
    }

    /// Its jitter, if any.
    pub fn jitter(&self) -> Option<&Jitter> {
        self.jitter.as_ref()
    }

    /// The longest delay its jitter may give an instant's fire (0 without
    /// jitter).
    pub fn max_jitter_ms(&self) -> Millis {
        self.jitter.as_ref().map_or(0, |j| j.max_ms)
    }

    /// The next instant strictly after `after_ms` within the bounds, or
    /// `None` when the schedule will not have another.
    pub fn next_after(&self, after_ms: Millis) -> Option<Millis> {
        let after = match self.start_ms {
            Some(start) => after_ms.max(start.saturating_sub(1)),
            None => after_ms,
        };
        let next = self.rule.next_after(after)?;
        self.end_ms.is_none_or(|end| next <= end).then_some(next)
    }

    /// When the instant `at_ms` fires: `at_ms` delayed by its jitter (see
    /// [`Jitter::offset_ms`]), always before the next instant's fire.
    pub fn fire_at(&self, at_ms: Millis) -> Millis {
        match &self.jitter {
            None => at_ms,
            Some(j) => at_ms.saturating_add(j.offset_ms(at_ms, self.next_after(at_ms))),
        }
    }

    /// Whether `at_ms` is one of the schedule's instants.
    pub fn includes(&self, at_ms: Millis) -> bool {
        at_ms.checked_sub(1).and_then(|before| self.next_after(before)) == Some(at_ms)
    }

    /// Every instant in `(after_ms, until_ms]`, at most `limit` of them,
    /// plus whether the list was cut short by `limit`.
    pub fn fires_between(&self, after_ms: Millis, until_ms: Millis, limit: usize) -> (Vec<Millis>, bool) {
        let mut out = Vec::new();
        let mut cursor = after_ms;
        while let Some(next) = self.next_after(cursor) {
            if next > until_ms {
                return (out, false);
            }
            if out.len() == limit {
                return (out, true);
            }
            out.push(next);
            cursor = next;
        }
        (out, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> Millis {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis()
    }
    fn iso(m: Millis) -> String {
        crate::format_millis(m)
    }

    #[test]
    fn a_schedule_includes_exactly_its_fire_instants() {
        // 02:30 Berlin, and on the spring-forward day (02:30 does not
        // exist) the first instant after the gap.
        let c = Schedule::from(Rule::Cron(Box::new(CronSchedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap())));
        assert!(c.includes(ms("2026-03-30T00:30:00Z")));
        assert!(c.includes(ms("2026-03-29T01:00:00Z")));
        assert!(!c.includes(ms("2026-03-30T00:30:00.001Z")));
        assert!(!c.includes(ms("2026-03-30T00:29:59.999Z")));
        let every = Schedule::from(Rule::Every { every_ms: 60_000 });
        assert!(every.includes(120_000) && every.includes(0) && !every.includes(120_001));
        let at = Schedule::from(Rule::At { at_ms: 5 });
        assert!(at.includes(5) && !at.includes(4));
        assert!(!Schedule::manual().includes(5));
        assert!(!at.includes(Millis::MIN));
    }

    #[test]
    fn six_and_five_fields() {
        let c = CronSchedule::parse("*/5 * * * * *", "UTC").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-01-01T00:00:01Z")).unwrap()), "2026-01-01T00:00:05.000Z");
        let c = CronSchedule::parse("*/15 * * * *", "UTC").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-01-01T00:00:01Z")).unwrap()), "2026-01-01T00:15:00.000Z");
        let c = CronSchedule::parse("@hourly", "UTC").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-01-01T00:00:00Z")).unwrap()), "2026-01-01T01:00:00.000Z");
    }

    #[test]
    fn strictly_after_even_mid_second() {
        let c = CronSchedule::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(c.next_after(ms("2026-01-01T00:00:00.500Z")).unwrap(), ms("2026-01-01T00:00:01Z"));
        assert_eq!(c.next_after(ms("2026-01-01T00:00:01Z")).unwrap(), ms("2026-01-01T00:00:02Z"));
    }

    #[test]
    fn last_day_weekday_and_nth() {
        let c = CronSchedule::parse("0 0 12 L * *", "UTC").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-02-03T00:00:00Z")).unwrap()), "2026-02-28T12:00:00.000Z");
        // 15W in Aug 2026: the 15th is a Saturday, closest weekday is Friday 14th.
        let c = CronSchedule::parse("0 0 9 15W * *", "UTC").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-08-01T00:00:00Z")).unwrap()), "2026-08-14T09:00:00.000Z");
        // Second Monday of March 2026 is the 9th.
        let c = CronSchedule::parse("0 0 9 * 3 MON#2", "UTC").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-03-01T00:00:00Z")).unwrap()), "2026-03-09T09:00:00.000Z");
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(CronSchedule::parse("61 * * * * *", "UTC").unwrap_err().code, "invalid_cron");
        assert_eq!(CronSchedule::parse("* * *", "UTC").unwrap_err().code, "invalid_cron");
        assert_eq!(CronSchedule::parse("", "UTC").unwrap_err().code, "invalid_cron");
        assert_eq!(CronSchedule::parse("* * * * *", "Mars/Olympus").unwrap_err().code, "invalid_timezone");
        assert_eq!(CronSchedule::parse("0 0 0 30 2 *", "UTC").unwrap_err().code, "invalid_cron");
    }

    #[test]
    fn spring_forward_gap_fires_once_at_gap_end() {
        // Europe/Berlin jumps 02:00 -> 03:00 on 2026-03-29 (01:00Z).
        let c = CronSchedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
        let fire = c.next_after(ms("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(iso(fire), "2026-03-29T01:00:00.000Z");
        // And the day after it is back at 02:30 local (00:30Z, summer time).
        assert_eq!(iso(c.next_after(fire).unwrap()), "2026-03-30T00:30:00.000Z");
        // Several fixed times in the gap collapse into one fire at 03:00 local.
        let c = CronSchedule::parse("0 0,15,30 2 * * *", "Europe/Berlin").unwrap();
        let (fires, _) =
            Schedule::from(Rule::Cron(Box::new(c))).fires_between(ms("2026-03-29T00:30:00Z"), ms("2026-03-29T03:00:00Z"), 1000);
        assert_eq!(fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(), vec!["2026-03-29T01:00:00.000Z"]);
        // A frequent expression (every minute of hour 2) runs on absolute
        // time: the gap's times do not exist, so nothing fires for them.
        let c = CronSchedule::parse("0 * 2 * * *", "Europe/Berlin").unwrap();
        let (fires, _) =
            Schedule::from(Rule::Cron(Box::new(c))).fires_between(ms("2026-03-29T00:30:00Z"), ms("2026-03-29T03:00:00Z"), 1000);
        assert!(fires.is_empty(), "{fires:?}");
    }

    #[test]
    fn fall_back_overlap_fires_once_at_first_occurrence() {
        // Europe/Berlin repeats 02:00-03:00 on 2026-10-25: 00:00Z-01:00Z (CEST) and 01:00Z-02:00Z (CET).
        let c = CronSchedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
        let s = Schedule::from(Rule::Cron(Box::new(c)));
        let (fires, _) = s.fires_between(ms("2026-10-24T12:00:00Z"), ms("2026-10-26T12:00:00Z"), 10);
        assert_eq!(fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(), vec!["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]);
        // Hourly is frequent: on absolute time, one fire an hour through the
        // overlap (02:00 CEST, 02:00 CET, 03:00 CET).
        let c = CronSchedule::parse("0 0 * * * *", "Europe/Berlin").unwrap();
        let s = Schedule::from(Rule::Cron(Box::new(c)));
        let (fires, _) = s.fires_between(ms("2026-10-24T23:30:00Z"), ms("2026-10-25T02:30:00Z"), 10);
        assert_eq!(
            fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(),
            vec!["2026-10-25T00:00:00.000Z", "2026-10-25T01:00:00.000Z", "2026-10-25T02:00:00.000Z"]
        );
        // Asking from inside the second pass of the overlap does not go backwards.
        let next = s.next_after(ms("2026-10-25T01:30:00Z")).unwrap();
        assert_eq!(iso(next), "2026-10-25T02:00:00.000Z");
    }

    #[test]
    fn us_zone_gap_and_overlap() {
        // America/New_York: 2026-03-08 02:00 -> 03:00 (07:00Z); 2026-11-01 02:00 -> 01:00 (06:00Z).
        let c = CronSchedule::parse("0 15 2 * * *", "America/New_York").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-03-06T12:00:00Z")).unwrap()), "2026-03-07T07:15:00.000Z");
        assert_eq!(iso(c.next_after(ms("2026-03-07T08:00:00Z")).unwrap()), "2026-03-08T07:00:00.000Z");
        let c = CronSchedule::parse("0 30 1 * * *", "America/New_York").unwrap();
        assert_eq!(iso(c.next_after(ms("2026-11-01T00:00:00Z")).unwrap()), "2026-11-01T05:30:00.000Z");
        assert_eq!(iso(c.next_after(ms("2026-11-01T05:30:00Z")).unwrap()), "2026-11-02T06:30:00.000Z");
    }

    /// cronie's rule, through both 2026 transitions in New York, for a
    /// frequent and a fixed-time expression.
    #[test]
    fn frequent_cron_keeps_absolute_time_and_fixed_times_fire_once() {
        let every5 = Schedule::from(Rule::Cron(Box::new(CronSchedule::parse("0 */5 * * * *", "America/New_York").unwrap())));
        // Fall back (2026-11-01 06:00Z: 02:00 EDT -> 01:00 EST): every five
        // minutes of absolute time, through both passes of 01:xx.
        let (fires, _) = every5.fires_between(ms("2026-11-01T05:50:00Z"), ms("2026-11-01T07:10:00Z"), 100);
        assert_eq!(fires.len(), 16, "{:?}", fires.iter().map(|f| iso(*f)).collect::<Vec<_>>());
        assert_eq!(fires[0], ms("2026-11-01T05:55:00Z"));
        assert!(fires.windows(2).all(|w| w[1] - w[0] == 300_000), "{:?}", fires.iter().map(|f| iso(*f)).collect::<Vec<_>>());
        // Spring forward (2026-03-08 07:00Z: 02:00 EST -> 03:00 EDT): still
        // every five minutes of absolute time (01:55 EST, then 03:00 EDT).
        let (fires, _) = every5.fires_between(ms("2026-03-08T06:50:00Z"), ms("2026-03-08T07:10:00Z"), 100);
        assert_eq!(
            fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(),
            vec!["2026-03-08T06:55:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-08T07:05:00.000Z", "2026-03-08T07:10:00.000Z"]
        );
        // Asking from inside the repeated hour's second pass moves forward.
        assert_eq!(every5.next_after(ms("2026-11-01T06:31:00Z")), Some(ms("2026-11-01T06:35:00Z")));
        // Fixed times: once at the first 01:30 on fall-back day; at the gap's
        // end on spring-forward day.
        let fixed = Schedule::from(Rule::Cron(Box::new(CronSchedule::parse("0 30 1 * * *", "America/New_York").unwrap())));
        let (fires, _) = fixed.fires_between(ms("2026-10-31T12:00:00Z"), ms("2026-11-01T12:00:00Z"), 10);
        assert_eq!(fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(), vec!["2026-11-01T05:30:00.000Z"]);
        let fixed = Schedule::from(Rule::Cron(Box::new(CronSchedule::parse("0 30 2 * * *", "America/New_York").unwrap())));
        let (fires, _) = fixed.fires_between(ms("2026-03-07T12:00:00Z"), ms("2026-03-08T12:00:00Z"), 10);
        assert_eq!(fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(), vec!["2026-03-08T07:00:00.000Z"]);
    }

    #[test]
    fn frequent_or_fixed() {
        assert!(is_frequent("0 */5 * * * *"));
        assert!(is_frequent("*/10 * * * *"));
        assert!(is_frequent("0 0 * * * *"));
        assert!(is_frequent("0 * 2 * * *"));
        assert!(is_frequent("@hourly"));
        assert!(!is_frequent("0 30 1 * * *"));
        assert!(!is_frequent("30 1 * * *"));
        assert!(!is_frequent("0 0,30 9 * * *"));
        assert!(!is_frequent("@daily"));
    }

    #[test]
    fn every_runs_on_absolute_time_across_dst() {
        let s = Schedule::from(Rule::Every { every_ms: 3_600_000 });
        let (fires, _) = s.fires_between(ms("2026-10-24T23:30:00Z"), ms("2026-10-25T03:30:00Z"), 10);
        assert_eq!(fires.len(), 4);
        assert!(fires.windows(2).all(|w| w[1] - w[0] == 3_600_000));
        assert_eq!(s.next_after(ms("2026-01-01T00:00:00Z")).unwrap(), ms("2026-01-01T01:00:00Z"));
    }

    #[test]
    fn at_and_manual() {
        let at = Schedule::from(Rule::At { at_ms: 5000 });
        assert_eq!(at.next_after(0), Some(5000));
        assert_eq!(at.next_after(5000), None);
        assert_eq!(Rule::Manual.next_after(0), None);
    }

    #[test]
    fn fires_between_reports_truncation() {
        let s = Schedule::from(Rule::Every { every_ms: 1000 });
        let (fires, cut) = s.fires_between(0, 10_000, 3);
        assert_eq!(fires, vec![1000, 2000, 3000]);
        assert!(cut);
    }
}
