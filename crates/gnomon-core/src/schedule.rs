//! Schedules: cron (with seconds, time zones and a defined DST policy),
//! fixed intervals on absolute time, one-shot times, and manual-only.
//!
//! # DST policy
//! Cron expressions are evaluated on the job's local wall clock.
//! - A wall-clock time that falls in a spring-forward gap does not exist; it
//!   fires once, at the first instant after the gap (the transition instant).
//!   Several gap times (e.g. every minute from 02:00 to 02:59) collapse into
//!   that one fire.
//! - A wall-clock time repeated in a fall-back overlap fires once, at its
//!   first occurrence.
//! - `every` schedules run on absolute time (multiples of the interval since
//!   the Unix epoch) and ignore wall clocks entirely.

use chrono::{DateTime, Duration as ChronoDuration, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use crate::{Millis, SpecError};

/// A parsed, validated schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    Cron(Box<CronSchedule>),
    /// Fires at every multiple of `every_ms` since the Unix epoch.
    Every {
        every_ms: i64,
    },
    /// Fires once at the given instant.
    At {
        at_ms: Millis,
    },
    /// Never fires by itself; manual triggers only.
    Manual,
}

#[derive(Debug, Clone)]
pub struct CronSchedule {
    pub expression: String,
    pub timezone: Tz,
    cron: croner::Cron,
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
        let schedule = Self { expression: trimmed.to_string(), timezone: tz, cron };
        // Reject expressions that can never fire (e.g. "0 0 0 30 2 *").
        let probe = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single().map(|d| d.timestamp_millis()).unwrap_or(0);
        if schedule.next_after(probe).is_none() {
            return Err(SpecError::new("invalid_cron", "schedule.cron", format!("cron expression {trimmed:?} never matches a real date")));
        }
        Ok(schedule)
    }

    /// The next fire instant strictly after `after_ms`, per the DST policy.
    pub fn next_after(&self, after_ms: Millis) -> Option<Millis> {
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

impl Schedule {
    /// The next fire instant strictly after `after_ms`, or `None` when the
    /// schedule will not fire again.
    pub fn next_after(&self, after_ms: Millis) -> Option<Millis> {
        match self {
            Schedule::Cron(cron) => cron.next_after(after_ms),
            Schedule::Every { every_ms } => {
                let every = *every_ms;
                if every <= 0 {
                    return None;
                }
                let k = after_ms.div_euclid(every) + 1;
                k.checked_mul(every)
            }
            Schedule::At { at_ms } => (*at_ms > after_ms).then_some(*at_ms),
            Schedule::Manual => None,
        }
    }

    /// Every fire instant in `(after_ms, until_ms]`, at most `limit` of them,
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
        // Every minute during the gap collapses into one fire at 03:00 local.
        let c = CronSchedule::parse("0 * 2 * * *", "Europe/Berlin").unwrap();
        let (fires, _) = Schedule::Cron(Box::new(c)).fires_between(ms("2026-03-29T00:30:00Z"), ms("2026-03-29T03:00:00Z"), 1000);
        assert_eq!(fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(), vec!["2026-03-29T01:00:00.000Z"]);
    }

    #[test]
    fn fall_back_overlap_fires_once_at_first_occurrence() {
        // Europe/Berlin repeats 02:00-03:00 on 2026-10-25: 00:00Z-01:00Z (CEST) and 01:00Z-02:00Z (CET).
        let c = CronSchedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
        let s = Schedule::Cron(Box::new(c));
        let (fires, _) = s.fires_between(ms("2026-10-24T12:00:00Z"), ms("2026-10-26T12:00:00Z"), 10);
        assert_eq!(fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(), vec!["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]);
        // Hourly in the overlap: 02:00 local fires once; 03:00 local follows.
        let c = CronSchedule::parse("0 0 * * * *", "Europe/Berlin").unwrap();
        let s = Schedule::Cron(Box::new(c));
        let (fires, _) = s.fires_between(ms("2026-10-24T23:30:00Z"), ms("2026-10-25T02:30:00Z"), 10);
        assert_eq!(fires.iter().map(|f| iso(*f)).collect::<Vec<_>>(), vec!["2026-10-25T00:00:00.000Z", "2026-10-25T02:00:00.000Z"]);
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

    #[test]
    fn every_runs_on_absolute_time_across_dst() {
        let s = Schedule::Every { every_ms: 3_600_000 };
        let (fires, _) = s.fires_between(ms("2026-10-24T23:30:00Z"), ms("2026-10-25T03:30:00Z"), 10);
        assert_eq!(fires.len(), 4);
        assert!(fires.windows(2).all(|w| w[1] - w[0] == 3_600_000));
        assert_eq!(s.next_after(ms("2026-01-01T00:00:00Z")).unwrap(), ms("2026-01-01T01:00:00Z"));
    }

    #[test]
    fn at_and_manual() {
        let at = Schedule::At { at_ms: 5000 };
        assert_eq!(at.next_after(0), Some(5000));
        assert_eq!(at.next_after(5000), None);
        assert_eq!(Schedule::Manual.next_after(0), None);
    }

    #[test]
    fn fires_between_reports_truncation() {
        let s = Schedule::Every { every_ms: 1000 };
        let (fires, cut) = s.fires_between(0, 10_000, 3);
        assert_eq!(fires, vec![1000, 2000, 3000]);
        assert!(cut);
    }
}
