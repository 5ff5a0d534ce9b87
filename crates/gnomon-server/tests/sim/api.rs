//! What the API does to the simulated scheduler during the faulty phase:
//! job writes, pauses, triggers (keyed, replayed webhook calls, withdrawn),
//! backfills and cancels, as the API would ask them.

use std::sync::Arc;

use gnomon_backend::{Precondition, Store};
use gnomon_core::spec::parse_job_json;
use gnomon_core::Millis;
use gnomon_server::leader::{AskClaim, LeaderCommand, Origin, TriggerError, TriggerRequest};
use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::oneshot;

use crate::history::History;
use crate::{SimJob, Term, DRAIN_MS, FAULT_MS, T0};

/// A trigger sent to the leader: its job and idempotency key, if it has
/// one, the params and the payload its runs must record, and where its
/// answer comes.
pub type Trigger = (
    Option<(String, String)>,
    (Option<String>, Option<String>),
    oneshot::Receiver<Result<gnomon_server::leader::Triggered, TriggerError>>,
    Option<Withdraw>,
);

/// A trigger whose caller stops waiting at `at` (as an API call that timed
/// out, or whose client went away): withdrawn unless the leader planned it
/// first. Its runs carry the params value `tier`.
pub struct Withdraw {
    pub at: Millis,
    pub claim: AskClaim,
    pub tier: String,
}

/// What the API does during the faulty phase: re-apply a job (a new
/// version, same schedule), pause or resume one, trigger manual runs,
/// cancel an open run.
pub async fn api_actions(
    rng: &mut StdRng,
    sqlite: &Arc<dyn Store>,
    jobs: &[SimJob],
    term: &Term,
    triggers: &mut Vec<Trigger>,
    h: &mut History,
    now: Millis,
) -> Result<(), String> {
    let job = &jobs[rng.gen_range(0..jobs.len())];
    let roll: f64 = rng.gen();
    if roll < 0.01 {
        // The same schedule, other retry settings: a new version.
        let json = job.spec_json.replace("ATTEMPTS", &rng.gen_range(2..=5).to_string());
        let spec = parse_job_json(json.as_bytes()).map_err(|e| format!("{e} in {json}"))?.compile().map_err(|e| e.to_string())?.spec;
        sqlite.put_job(&spec, Precondition::None, now).await.map_err(|e| e.to_string())?;
        h.note(now, format!("job {} re-applied", job.name));
        let _ = term.commands.try_send(LeaderCommand::Nudge);
    } else if roll < 0.015 {
        let paused = h.paused.get(&job.name).and_then(|v| v.last()).is_some_and(|(_, resumed)| resumed.is_none());
        sqlite.set_job_paused("default", &job.name, !paused, now).await.map_err(|e| e.to_string())?;
        h.note(now, format!("job {} {}", job.name, if paused { "resumed" } else { "paused" }));
        let list = h.paused.entry(job.name.clone()).or_default();
        if paused {
            if let Some(last) = list.last_mut() {
                last.1 = Some(now);
            }
        } else {
            list.push((now, None));
        }
        let _ = term.commands.try_send(LeaderCommand::Nudge);
    } else if roll < 0.025 {
        let (reply, rx) = oneshot::channel();
        // Half of them with one of a few idempotency keys, so keys repeat
        // within a term and across terms; on a job that takes webhook
        // calls, some are unkeyed calls replayed (named by their
        // signature, here `call-N`).
        let replay = job.params && rng.gen_bool(0.2);
        // Some callers stop waiting before the answer (a few ticks, or at
        // once): their asks carry a tier of their own.
        let withdraw = (job.params && !replay && rng.gen_bool(0.2)).then(|| Withdraw {
            at: now + rng.gen_range(0..4) * crate::TICK,
            claim: AskClaim::default(),
            tier: format!("w-{}", h.log.len()),
        });
        let key = if let Some(w) = &withdraw {
            rng.gen_bool(0.5).then(|| format!("key-{}", w.tier))
        } else if replay {
            Some(format!(" call {}", rng.gen_range(0..3)))
        } else {
            rng.gen_bool(0.5).then(|| format!("key-{}", rng.gen_range(0..4)))
        };
        let count = if key.is_some() { 1 } else { rng.gen_range(1..=3) };
        // A job with params: some triggers set `tier`; a key always sets
        // the same value (key-0 and key-1 set one, the others none), so a
        // repeat is never another request.
        let mut params = gnomon_core::params::Params::new();
        let sets = match &key {
            Some(k) => k == "key-0" || k == "key-1",
            None => rng.gen_bool(0.5),
        };
        if let Some(w) = &withdraw {
            params.insert("tier".into(), serde_json::Value::String(w.tier.clone()));
        } else if job.params && sets {
            let tier = key.as_deref().map_or_else(|| format!("gold-{}", rng.gen_range(0..3)), |k| format!("gold-{k}"));
            params.insert("tier".into(), serde_json::Value::String(tier));
        }
        let expected = job.params.then(|| {
            let tier = params.get("tier").and_then(|v| v.as_str()).unwrap_or("std");
            format!(r#"{{"tier":"{tier}"}}"#)
        });
        // key-2 and key-3 on a job with params come as webhook calls, each
        // key with its own payload (a repeat carries the same).
        let hook = replay || job.params && matches!(key.as_deref(), Some("key-2" | "key-3"));
        let payload = hook.then(|| format!(r#"{{"event":"{}"}}"#, key.as_deref().unwrap_or_default().trim()));
        let origin = if hook { Origin::Webhook } else { Origin::Api };
        // The key a run is stored under: webhook calls' keys have a space
        // of their own.
        let stored = key.as_ref().map(|k| if hook { format!(" hook {k}") } else { k.clone() });
        if let Some(k) = &stored {
            h.keys_tried.push(k.clone());
        }
        let name = job.name.clone();
        let _ = term.commands.try_send(LeaderCommand::Trigger {
            namespace: "default".into(),
            name: name.clone(),
            request: TriggerRequest {
                count,
                key: key.clone(),
                params,
                payload: payload.clone(),
                origin,
                claim: withdraw.as_ref().map(|w| w.claim.clone()).unwrap_or_default(),
            },
            reply,
        });
        if let Some(w) = &withdraw {
            h.note(now, format!("trigger {} of {} asked (to be withdrawn at +{})", w.tier, job.name, w.at - crate::T0));
        }
        triggers.push((stored.map(|k| (name, k)), (expected, payload), rx, withdraw));
    } else if roll < 0.027 {
        // A backfill, as the API asks the leader for it: a range of the job's instants
        // before and after its creation (those after have records, kept),
        // at a few instants a second; some are cancelled later.
        let uid = sqlite.get_job("default", &job.name).await.map_err(|e| e.to_string())?.map(|j| j.uid);
        if let Some(uid) = uid {
            let mut from = (job.created_at / job.every_ms - rng.gen_range(5..40)) * job.every_ms;
            let to = (job.created_at + rng.gen_range(0..10_000)).min(now - 1);
            let time_left = u64::try_from(T0 + FAULT_MS + DRAIN_MS - now).unwrap_or(1).max(1);
            // No more instants than their runs can run through in the time
            // left, one after another (a job that forbids overlap runs its
            // backfill's runs in turn, and a run takes about a second with
            // its retries; seeds 131 and 798: 39 and 13 instants asked late
            // of such jobs never ended).
            let most = usize::try_from(time_left / 5_000).unwrap_or(usize::MAX).max(2);
            let fires = job.schedule.fires_between(from - 1, to, usize::MAX).0;
            if fires.len() > most {
                from = fires[fires.len() - most];
            }
            let total = fires.len().min(most) as u64;
            let b = gnomon_backend::NewBackfill {
                id: gnomon_backend::backfill_id(&uid, now),
                namespace: "default".into(),
                job: job.name.clone(),
                job_uid: uid,
                from,
                to,
                params: job.params.then(|| r#"{"tier":"std"}"#.to_string()),
                // Fast enough to finish in half the time left: the checker
                // wants every backfill ended, and faults may cost a few
                // steps (seed 1021: 57 instants at 1 a second, asked 30 s
                // in, needed 92 s of a 90 s history).
                rate: rng.gen_range(1..=20).max(u32::try_from(total * 2_000 / time_left + 1).unwrap_or(u32::MAX)),
                total,
            };
            // Asked of the leader, which writes it in a turn (its answer
            // is not awaited: the checker reads what the store holds).
            h.note(now, format!("backfill {} of {} over {from}..{to} asked", b.id, job.name));
            let (reply, _answer) = oneshot::channel();
            let _ = term.commands.try_send(LeaderCommand::Backfill { new: b, reply });
        }
    } else if roll < 0.028 {
        let running = sqlite.running_backfills().await.map_err(|e| e.to_string())?;
        if let Some(b) = running.first() {
            sqlite.cancel_backfill(&b.id, now).await.map_err(|e| e.to_string())?;
            h.note(now, format!("backfill {} cancelled", b.id));
        }
    } else if roll < 0.035 {
        let open = sqlite.open_runs().await.map_err(|e| e.to_string())?;
        if !open.is_empty() {
            let run = &open[rng.gen_range(0..open.len())];
            let _ = sqlite.request_cancel(&run.id, now).await;
            let _ = term.commands.try_send(LeaderCommand::Nudge);
        }
    }
    Ok(())
}
