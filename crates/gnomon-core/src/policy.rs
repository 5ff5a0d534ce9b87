//! Misfire and overlap policies, applied by the trigger at fire time.
//!
//! A scheduled time is *on time* when the trigger reaches it within
//! `grace_ms` of it, and *misfired* otherwise (the leader was down, paused or
//! changing). Invariant 4: every scheduled time after a job's
//! `last_scheduled_at` ends as a fire or a recorded skip.

#[cfg(test)]
use crate::schedule::Rule;
use crate::schedule::Schedule;
use crate::spec::{MisfirePolicy, OverlapPolicy};
use crate::Millis;

/// How many out-of-window misses are recorded one by one before the rest are
/// summarised in one skip record.
pub const MAX_INDIVIDUAL_SKIPS: usize = 100;
/// How many fires one planning step produces at most; the caller plans again
/// from the returned `last_scheduled_at` when `more` is set.
pub const MAX_FIRES_PER_PLAN: usize = 1000;

/// What becomes of one scheduled time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It gets a run that executes.
    Fire,
    /// It is recorded as a `skipped` run with this reason (e.g.
    /// `misfire: policy skip`).
    Skip(String),
}

/// One scheduled time of a plan and its decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTime {
    /// The scheduled time, in milliseconds since the Unix epoch: the run's
    /// `scheduled_at`.
    pub scheduled_at: Millis,
    /// Whether it fires or is skipped.
    pub decision: Decision,
}

/// The outcome of [`plan_fires`]: the due times of one job in order, each
/// fired or skipped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FirePlan {
    /// In time order.
    pub times: Vec<PlannedTime>,
    /// The new `last_scheduled_at` (the latest time covered by this plan).
    pub last_scheduled_at: Option<Millis>,
    /// More due times remain after `last_scheduled_at`; plan again.
    pub more: bool,
}

/// What [`plan_fires`] needs to know about one job and the time.
pub struct PlanInput<'a> {
    /// The job's compiled schedule.
    pub schedule: &'a Schedule,
    /// The persisted `last_scheduled_at`, or the job's creation time for a job
    /// that never fired (a new job does not fire for times before it existed).
    pub after: Millis,
    /// The leader's current time, in milliseconds since the Unix epoch.
    pub now: Millis,
    /// Only times up to this are planned (a previous version's times up to
    /// its change); lateness is still measured against `now`.
    pub until: Millis,
    /// The job's misfire policy, for times reached more than `grace_ms`
    /// late.
    pub misfire: MisfirePolicy,
    /// How far before `now` missed times may still fire, in milliseconds;
    /// older ones are skipped whatever the policy.
    pub catchup_window_ms: i64,
    /// How late a time may be reached and still count as on time, in
    /// milliseconds (`--misfire-grace`).
    pub grace_ms: i64,
    /// Times fire at their jittered fire time (else at the time itself:
    /// what a previous version of the job left due fires at once).
    pub jittered: bool,
}

/// Decides, for every scheduled time in `(after, min(now, until)]`, whether
/// it fires or is skipped.
pub fn plan_fires(input: &PlanInput<'_>) -> FirePlan {
    let mut plan = FirePlan::default();
    let end = input.now.min(input.until);
    let window_start = input.now.saturating_sub(input.catchup_window_ms.max(input.grace_ms));
    let mut cursor = input.after;

    // 1. Times before the catch-up window: skipped regardless of policy.
    if cursor < window_start {
        let (old, truncated) = input.schedule.fires_between(cursor, window_start.min(end), MAX_INDIVIDUAL_SKIPS);
        if truncated {
            // Summarise: one record at the latest out-of-window time.
            let last_old = last_fire_at_or_before(input.schedule, window_start.min(end)).unwrap_or(window_start.min(end));
            let first = old.first().copied().unwrap_or(last_old);
            plan.times.push(PlannedTime {
                scheduled_at: last_old,
                decision: Decision::Skip(format!(
                    "misfire: more than {MAX_INDIVIDUAL_SKIPS} scheduled times from {} to {} were outside the catch-up window",
                    crate::format_millis(first),
                    crate::format_millis(last_old)
                )),
            });
            cursor = last_old;
        } else {
            for t in old {
                plan.times.push(PlannedTime { scheduled_at: t, decision: Decision::Skip("misfire: outside the catch-up window".into()) });
                cursor = t;
            }
        }
        // Jump past the gap in any case.
        cursor = cursor.max(window_start.min(end));
    }

    // 2. Times inside the window whose fire time has come (a jittered
    // time fires later than it is; fire times keep the times' order, so
    // the due ones come first). Lateness counts from the fire time.
    let (mut recent, mut more) = input.schedule.fires_between(cursor, end, MAX_FIRES_PER_PLAN);
    let fire_at = |t: Millis| if input.jittered { input.schedule.fire_at(t) } else { t };
    while recent.last().is_some_and(|t| fire_at(*t) > input.now) {
        recent.pop();
        more = false;
    }
    let is_late = |t: Millis| input.now - fire_at(t) > input.grace_ms;
    let latest_late = recent.iter().copied().rfind(|t| is_late(*t));
    for t in recent.iter().copied() {
        let is_late = is_late(t);
        let decision = if !is_late {
            Decision::Fire
        } else {
            match input.misfire {
                MisfirePolicy::Skip => Decision::Skip("misfire: policy skip".into()),
                MisfirePolicy::FireAll => Decision::Fire,
                // With `more`, the latest late time may lie beyond this batch;
                // skipping here would be wrong, so only the true latest fires.
                MisfirePolicy::FireOnce if Some(t) == latest_late && !more => Decision::Fire,
                MisfirePolicy::FireOnce => Decision::Skip("misfire: policy fire_once (a later missed time fired)".into()),
            }
        };
        plan.times.push(PlannedTime { scheduled_at: t, decision });
    }
    plan.more = more;
    plan.last_scheduled_at = plan.times.last().map(|p| p.scheduled_at);
    plan
}

fn last_fire_at_or_before(schedule: &Schedule, t: Millis) -> Option<Millis> {
    // Walk back in growing steps until a fire lies in (probe, t], then take the last.
    let mut span: i64 = 1000;
    while span < 400 * 24 * 3600 * 1000 {
        let probe = t.saturating_sub(span);
        let (times, truncated) = schedule.fires_between(probe, t, 100_000);
        if let Some(last) = times.last() {
            if !truncated {
                return Some(*last);
            }
        }
        if truncated {
            // Too dense to list; narrow instead of widening.
            return schedule.fires_between(t.saturating_sub(span / 100_000 + 1000), t, 100_000).0.last().copied();
        }
        span *= 8;
    }
    None
}

/// What the overlap policy says about a new fire, given the job's runs that
/// are still open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverlapDecision {
    /// Fire; the open runs are left alone.
    Fire,
    /// Fire, and cancel the job's open runs.
    FireAndCancelOpen,
    /// Do not fire: record the time as a `skipped` run with this reason.
    Skip(String),
}

/// `open` counts the job's runs that are not terminal (pending, assigned,
/// running, retrying); `waiting` counts those of them not yet started
/// (pending or retrying).
pub fn decide_overlap(policy: OverlapPolicy, open: usize, waiting: usize) -> OverlapDecision {
    match policy {
        OverlapPolicy::Allow => OverlapDecision::Fire,
        _ if open == 0 => OverlapDecision::Fire,
        OverlapPolicy::Forbid => OverlapDecision::Skip("overlap: policy forbid and a previous run is still open".into()),
        OverlapPolicy::Replace => OverlapDecision::FireAndCancelOpen,
        OverlapPolicy::BufferOne if waiting == 0 => OverlapDecision::Fire,
        OverlapPolicy::BufferOne => OverlapDecision::Skip("overlap: policy buffer_one and a run is already waiting".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1000;

    fn plan(misfire: MisfirePolicy, after: Millis, now: Millis, window: i64) -> FirePlan {
        let schedule = Schedule::from(Rule::Every { every_ms: S });
        plan_fires(&PlanInput {
            schedule: &schedule,
            after,
            now,
            until: now,
            misfire,
            catchup_window_ms: window,
            grace_ms: S,
            jittered: true,
        })
    }

    fn fired(p: &FirePlan) -> Vec<Millis> {
        p.times.iter().filter(|t| t.decision == Decision::Fire).map(|t| t.scheduled_at).collect()
    }

    #[test]
    fn on_time_fires_regardless_of_policy() {
        for m in [MisfirePolicy::Skip, MisfirePolicy::FireOnce, MisfirePolicy::FireAll] {
            let p = plan(m, 100 * S, 101 * S + 5, 3600 * S);
            assert_eq!(fired(&p), vec![101 * S]);
            assert_eq!(p.last_scheduled_at, Some(101 * S));
        }
    }

    #[test]
    fn restart_after_thirty_seconds() {
        // Down from t=100s to t=130.005s: times 101..=130.
        let skip = plan(MisfirePolicy::Skip, 100 * S, 130 * S + 5, 3600 * S);
        assert_eq!(fired(&skip), vec![130 * S], "only the on-time second fires");
        assert_eq!(skip.times.len(), 30, "every missed time is accounted for");
        let once = plan(MisfirePolicy::FireOnce, 100 * S, 130 * S + 5, 3600 * S);
        assert_eq!(fired(&once), vec![129 * S, 130 * S], "one catch-up (the latest late time) plus the on-time one");
        let all = plan(MisfirePolicy::FireAll, 100 * S, 130 * S + 5, 3600 * S);
        assert_eq!(fired(&all).len(), 30);
    }

    #[test]
    fn window_bounds_catch_up_and_long_outages_are_summarised() {
        let all = plan(MisfirePolicy::FireAll, 0, 100_000 * S, 10 * S);
        assert_eq!(fired(&all).len(), 10);
        let skips = all.times.iter().filter(|t| matches!(t.decision, Decision::Skip(_))).count();
        assert_eq!(skips, 1, "the 99,990 out-of-window times are one summary record");
        assert!(all.times.windows(2).all(|w| w[0].scheduled_at < w[1].scheduled_at));
        assert_eq!(all.last_scheduled_at, Some(100_000 * S));
        // A short outage lists each out-of-window time.
        let some = plan(MisfirePolicy::FireAll, 80 * S, 100 * S, 10 * S);
        assert_eq!(some.times.len(), 20);
    }

    #[test]
    fn dense_catch_up_is_batched() {
        let p = plan(MisfirePolicy::FireAll, 0, 5000 * S, 5000 * S);
        assert!(p.more);
        assert_eq!(p.times.len(), MAX_FIRES_PER_PLAN);
        let next = plan(MisfirePolicy::FireAll, p.last_scheduled_at.unwrap(), 5000 * S, 5000 * S);
        assert_eq!(next.times[0].scheduled_at, p.last_scheduled_at.unwrap() + S);
    }

    #[test]
    fn overlap_policies() {
        assert_eq!(decide_overlap(OverlapPolicy::Allow, 5, 5), OverlapDecision::Fire);
        assert_eq!(decide_overlap(OverlapPolicy::Forbid, 0, 0), OverlapDecision::Fire);
        assert!(matches!(decide_overlap(OverlapPolicy::Forbid, 1, 0), OverlapDecision::Skip(_)));
        assert_eq!(decide_overlap(OverlapPolicy::Replace, 1, 0), OverlapDecision::FireAndCancelOpen);
        assert_eq!(decide_overlap(OverlapPolicy::BufferOne, 1, 0), OverlapDecision::Fire);
        assert!(matches!(decide_overlap(OverlapPolicy::BufferOne, 2, 1), OverlapDecision::Skip(_)));
    }

    #[test]
    fn a_jittered_time_is_due_at_its_fire_time_and_late_from_it() {
        use crate::schedule::Jitter;
        let schedule = Schedule::from(Rule::Every { every_ms: 10 * S }).jittered(Some(Jitter { max_ms: 9 * S, seed: 7 }));
        let fire = schedule.fire_at(100 * S);
        assert!(fire > 100 * S, "this seed delays the time");
        let at = |now: Millis| {
            plan_fires(&PlanInput {
                schedule: &schedule,
                after: 90 * S,
                now,
                until: now,
                misfire: MisfirePolicy::Skip,
                catchup_window_ms: 3600 * S,
                grace_ms: S,
                jittered: true,
            })
        };
        assert!(at(fire - 1).times.is_empty(), "not due before its fire time");
        assert_eq!(fired(&at(fire)), vec![100 * S], "on time at its fire time, though later than the time");
        assert!(fired(&at(fire + 2 * S)).is_empty(), "late by more than the grace from its fire time");
        // What a previous version left due fires at once.
        let p = plan_fires(&PlanInput {
            schedule: &schedule,
            after: 90 * S,
            now: 100 * S,
            until: 100 * S,
            misfire: MisfirePolicy::Skip,
            catchup_window_ms: 3600 * S,
            grace_ms: S,
            jittered: false,
        });
        assert_eq!(fired(&p), vec![100 * S]);
    }
}
