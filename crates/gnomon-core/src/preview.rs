//! Schedule previews: the next fire times of a schedule, each with its
//! wall-clock time in the job's zone and what a daylight-saving change did
//! to it, so a person can check a schedule before saving it.

use chrono::{DateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use crate::schedule::{CronSchedule, Rule, Schedule};
use crate::Millis;

/// Most fire times one preview lists.
pub const MAX_PREVIEW: usize = 100;

/// One fire time of a preview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewFire {
    /// The instant (UTC).
    pub at: Millis,
    /// The zone's offset from UTC at that instant, in seconds.
    pub offset_seconds: i32,
    /// Set when the zone's offset differs from the one at the previous fire
    /// (or at the preview's start, for the first): the clocks changed.
    pub offset_changed_from: Option<i32>,
    /// What the DST policy did to this fire, in words, when it did anything.
    pub note: Option<String>,
    /// When it fires, for a jittered schedule: `at` delayed by its jitter.
    pub fire_at: Option<Millis>,
}

/// The zone's offset from UTC at an instant, in seconds.
pub fn offset_seconds(tz: &Tz, at: Millis) -> i32 {
    let at = DateTime::<Utc>::from_timestamp_millis(at).unwrap_or_default();
    tz.offset_from_utc_datetime(&at.naive_utc()).fix().local_minus_utc()
}

/// `+02:00`-style rendering of an offset in seconds.
pub fn format_offset(seconds: i32) -> String {
    let sign = if seconds < 0 { '-' } else { '+' };
    let abs = seconds.unsigned_abs();
    format!("{sign}{:02}:{:02}", abs / 3600, (abs % 3600) / 60)
}

/// RFC 3339 local time with its offset, e.g. `2026-03-29T03:00:00+02:00`.
pub fn format_local(tz: &Tz, at: Millis) -> String {
    let at = DateTime::<Utc>::from_timestamp_millis(at).unwrap_or_default();
    at.with_timezone(tz).fixed_offset().to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
}

/// The zone a schedule's wall-clock times are shown in: a cron schedule's
/// own zone, else UTC (`every` and `at` run on absolute time).
pub fn zone_of(schedule: &Schedule) -> Tz {
    match schedule.rule() {
        Rule::Cron(c) => c.timezone,
        _ => Tz::UTC,
    }
}

/// The first `count` (at most [`MAX_PREVIEW`]) fire times strictly after
/// `after`, annotated.
pub fn preview(schedule: &Schedule, after: Millis, count: usize) -> Vec<PreviewFire> {
    let tz = zone_of(schedule);
    let mut out = Vec::new();
    let mut cursor = after;
    let mut previous_offset = offset_seconds(&tz, after);
    while out.len() < count.min(MAX_PREVIEW) {
        let Some(at) = schedule.next_after(cursor) else { break };
        let offset = offset_seconds(&tz, at);
        let note = match schedule.rule() {
            Rule::Cron(c) => dst_note(c, at, offset),
            _ => None,
        };
        out.push(PreviewFire {
            at,
            offset_seconds: offset,
            offset_changed_from: (offset != previous_offset).then_some(previous_offset),
            note,
            fire_at: schedule.jitter().map(|_| schedule.fire_at(at)),
        });
        previous_offset = offset;
        cursor = at;
    }
    out
}

/// What the DST policy did to a cron fire: moved it out of a gap, or chose
/// a pass of a repeated hour.
fn dst_note(cron: &CronSchedule, at: Millis, offset: i32) -> Option<String> {
    let tz = cron.timezone;
    let local = DateTime::<Utc>::from_timestamp_millis(at)?.with_timezone(&tz).naive_local();
    let repeated = matches!(tz.from_local_datetime(&local), chrono::LocalResult::Ambiguous(..));
    if !cron.matches_wall_time(local) {
        return Some(format!(
            "the wall-clock time this schedule names does not exist on this day (the clocks went forward to {}); it fires once, at the end of the gap",
            format_offset(offset)
        ));
    }
    if !repeated {
        return None;
    }
    let first_pass = match tz.from_local_datetime(&local) {
        chrono::LocalResult::Ambiguous(a, b) => a.timestamp_millis().min(b.timestamp_millis()) == at,
        _ => true,
    };
    Some(match (cron.is_frequent(), first_pass) {
        (false, _) => {
            "this wall-clock time occurs twice on this day (the clocks go back); it fires at its first occurrence only".to_string()
        }
        (true, true) => "the clocks go back after this hour: this hour repeats, and the schedule runs in both passes".to_string(),
        (true, false) => "the second pass of an hour the clocks went back over: the schedule runs in both passes".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> Millis {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis()
    }

    #[test]
    fn a_fixed_time_in_a_spring_forward_gap_is_moved_and_marked() {
        // Europe/Berlin springs forward at 2026-03-29 02:00 → 03:00.
        let s = Schedule::from(Rule::Cron(Box::new(CronSchedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap())));
        let fires = preview(&s, ms("2026-03-27T12:00:00Z"), 4);
        let local: Vec<String> = fires.iter().map(|f| format_local(&Tz::Europe__Berlin, f.at)).collect();
        assert_eq!(
            local,
            ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]
        );
        assert!(fires[0].note.is_none() && fires[0].offset_changed_from.is_none());
        assert!(fires[1].note.as_deref().unwrap().contains("does not exist"));
        assert_eq!(fires[1].offset_changed_from, Some(3600));
        assert_eq!(fires[1].offset_seconds, 7200);
        assert!(fires[2].note.is_none() && fires[2].offset_changed_from.is_none());
    }

    #[test]
    fn a_repeated_hour_is_marked_for_fixed_and_frequent_expressions() {
        // Europe/Berlin falls back at 2026-10-25 03:00 → 02:00.
        let fixed = Schedule::from(Rule::Cron(Box::new(CronSchedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap())));
        let fires = preview(&fixed, ms("2026-10-24T12:00:00Z"), 2);
        assert_eq!(format_local(&Tz::Europe__Berlin, fires[0].at), "2026-10-25T02:30:00+02:00");
        assert!(fires[0].note.as_deref().unwrap().contains("first occurrence"));
        assert_eq!(fires[1].offset_changed_from, Some(7200));
        let frequent = Schedule::from(Rule::Cron(Box::new(CronSchedule::parse("0 30 * * * *", "Europe/Berlin").unwrap())));
        let fires = preview(&frequent, ms("2026-10-24T23:45:00Z"), 2);
        assert_eq!(format_local(&Tz::Europe__Berlin, fires[0].at), "2026-10-25T02:30:00+02:00");
        assert_eq!(format_local(&Tz::Europe__Berlin, fires[1].at), "2026-10-25T02:30:00+01:00");
        assert!(fires[0].note.as_deref().unwrap().contains("both passes"));
        assert!(fires[1].note.as_deref().unwrap().contains("second pass"));
    }

    #[test]
    fn intervals_and_limits() {
        let s = Schedule::from(Rule::Every { every_ms: 60_000 });
        let fires = preview(&s, 0, 1000);
        assert_eq!(fires.len(), MAX_PREVIEW);
        assert_eq!(fires[0].at, 60_000);
        assert!(fires.iter().all(|f| f.note.is_none() && f.offset_seconds == 0));
        assert!(preview(&Schedule::manual(), 0, 10).is_empty());
        assert_eq!(preview(&Schedule::from(Rule::At { at_ms: 5 }), 0, 10).len(), 1);
        assert_eq!(format_offset(-34200), "-09:30");
    }
}
