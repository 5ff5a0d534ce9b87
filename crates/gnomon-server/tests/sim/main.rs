//! Deterministic simulation of the scheduling core, in the manner of
//! FoundationDB's simulator and TigerBeetle's VOPR: one process, a manual
//! clock, the real leader runtime over a real SQLite store wrapped in a
//! fault injector, simulated workers, API-side edits, and leader terms
//! that change (the old leader kept running for a few steps, so its
//! writes must be fenced). After each seed a checker reads the store and
//! the workers' history and asserts the invariants.
//!
//! `GNOMON_SIM_SEEDS=N` runs N seeds (default 200, split over two tests),
//! from `GNOMON_SIM_FIRST_SEED` (default 1);
//! `GNOMON_SIM_SEED=S` replays one. A failure prints its seed and the
//! command that replays it. A seed fixes the workload, the faults, the
//! workers' behaviour and the jobs' uids, and the leader's maps hash with
//! fixed keys, so a seed replays the same history.

mod api;
mod check;
mod check_attempts;
mod history;
mod store;
mod worker;

use std::sync::Arc;

use gnomon_backend::sqlite::SqliteStore;
use gnomon_backend::{Fence, LeaderInfo, Precondition, Store};
use gnomon_core::spec::parse_job_json;
use gnomon_core::{Clock, ManualClock, Millis};
use gnomon_server::leader::{LeaderCommand, LeaderConfig, LeaderParts, LeaderRuntime, Step, TriggerError, Withdrawal};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot, watch};

use api::{api_actions, Trigger};
use gnomon_backend::roles::*;
use history::History;
use store::{FaultRates, FaultyStore};
use worker::SimWorker;

/// Simulated time per tick.
const TICK: Millis = 100;
/// Faults, crashes, pauses, edits and new terms happen for this long…
const FAULT_MS: Millis = 40_000;
/// …then none for this long, so that everything can settle.
const DRAIN_MS: Millis = 50_000;
/// The simulation's epoch (a whole second).
const T0: Millis = 1_800_000_000_000;
pub const LEASE_TTL_MS: Millis = 5_000;

struct Term {
    rt: LeaderRuntime,
    commands: mpsc::Sender<LeaderCommand>,
    lost: watch::Sender<bool>,
    _shutdown: watch::Sender<bool>,
}

async fn new_term(store: &Arc<FaultyStore>, clock: &ManualClock, seed: u64) -> Term {
    let token = store.next_epoch("scheduler").await.expect("epoch");
    let fence = Fence { scope: "scheduler".into(), token };
    store.fence(&fence, &LeaderInfo::default(), clock.now_millis()).await.expect("fence");
    let (commands, rx) = mpsc::channel(65_536);
    let (lost, lost_rx) = watch::channel(false);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let config = LeaderConfig { lease_ttl_ms: LEASE_TTL_MS, heartbeat_ms: 1_000, misfire_grace_ms: 1_000, ..Default::default() };
    let rt = LeaderRuntime::new(LeaderParts {
        store: store.clone(),
        fence,
        clock: Arc::new(clock.clone()),
        config,
        commands: rx,
        lost: lost_rx,
        shutdown: shutdown_rx,
        view: Default::default(),
        live: Default::default(),
        // Each term's random numbers (retry jitter) follow from the seed.
        seed: seed ^ token.rotate_left(32),
    });
    Term { rt, commands, lost, _shutdown: shutdown }
}

/// A job of the simulation: `every` `every_ms`, created at `created_at`.
pub struct SimJob {
    pub name: String,
    pub every_ms: Millis,
    pub created_at: Millis,
    /// It declares the param `tier` (default `std`).
    pub params: bool,
    /// Its schedule's bounds (`start_at`, `end_at`), if it has them.
    pub start_at: Option<Millis>,
    pub end_at: Option<Millis>,
    /// The longest delay its jitter gives a fire (0: none).
    pub jitter_ms: Millis,
    /// Its compiled schedule (for the fire times of its jitter).
    pub schedule: gnomon_core::Schedule,
    /// Its timeout.
    pub timeout_ms: Millis,
    spec_json: String,
}

impl SimJob {
    /// Whether `t` lies within the schedule's bounds.
    pub fn in_bounds(&self, t: Millis) -> bool {
        self.start_at.is_none_or(|s| t >= s) && self.end_at.is_none_or(|e| t <= e)
    }
}

/// The schedule fields of a simulated job: an interval, sometimes bounds
/// (a start and an end within the run) and a jitter (shorter or longer
/// than the interval; it is capped below the next instant).
fn schedule_json(every_ms: Millis, rng: &mut StdRng) -> (String, Option<Millis>, Option<Millis>, Millis) {
    let (mut start, mut end) = (None, None);
    if rng.gen_bool(0.3) {
        let s = T0 + rng.gen_range(0..20) * 1_000 + rng.gen_range(0..every_ms);
        start = Some(s);
        end = rng.gen_bool(0.7).then(|| s + rng.gen_range(5_000..60_000));
    }
    let jitter = if rng.gen_bool(0.3) { [every_ms / 2, every_ms * 3, 250][rng.gen_range(0..3)] } else { 0 };
    let mut fields = vec![format!(r#""every":"{every_ms}ms""#)];
    fields.extend(start.map(|s| format!(r#""start_at":"{}""#, gnomon_core::format_millis(s))));
    fields.extend(end.map(|e| format!(r#""end_at":"{}""#, gnomon_core::format_millis(e))));
    if jitter > 0 {
        fields.push(format!(r#""jitter":"{jitter}ms""#));
    }
    (format!("{{{}}}", fields.join(",")), start, end, jitter)
}

/// The params of a simulated job that has them, and their defaults.
pub const SIM_PARAMS: &str = r#"{"tier":{"default":"std"}}"#;
/// A simulated job with params also takes webhook calls.
const SIM_TRIGGERS: &str = r#""triggers":{"webhook":{"secret":"sim"}}"#;

fn job_json(name: &str, schedule: &str, params: bool, timeout_ms: Millis, rng: &mut StdRng) -> String {
    let overlap = ["allow", "allow", "forbid", "buffer_one", "replace"][rng.gen_range(0..5)];
    let misfire = ["fire_once", "fire_all", "skip"][rng.gen_range(0..3)];
    let params = if params { format!(r#""params":{SIM_PARAMS},{SIM_TRIGGERS},"#) } else { String::new() };
    format!(
        r#"{{"name":"{name}","schedule":{schedule},"executor":{{"handler":{{"name":"noop"}}}},{params}
            "retry":{{"max_attempts":ATTEMPTS,"backoff":{{"initial":"300ms","max":"1s","jitter":0.2}}}},
            "overlap":"{overlap}","misfire":"{misfire}","timeout":"{timeout_ms}ms",
            "notify":[{{"on":["failed","succeeded","recovered"],"webhook":{{"url":"http://127.0.0.1:9/sim"}}}}]}}"#
    )
}

/// The timeout of the simulation's dependency jobs.
pub const DEP_TIMEOUT_MS: Millis = 4_000;

/// A dependency job of the simulation: no schedule, runs after `after`
/// (upstream name, `on`).
pub struct SimDep {
    pub name: String,
    pub after: Vec<(String, gnomon_core::deps::On)>,
}

fn dep_json(dep: &SimDep) -> String {
    let after: Vec<String> = dep.after.iter().map(|(j, on)| format!(r#"{{"job":"{j}","on":"{}"}}"#, on.as_str())).collect();
    format!(
        r#"{{"name":"{}","after":[{}],"executor":{{"handler":{{"name":"noop"}}}},
            "retry":{{"max_attempts":3,"backoff":{{"initial":"300ms","max":"1s","jitter":0.2}}}},
            "timeout":"{DEP_TIMEOUT_MS}ms",
            "notify":[{{"on":["failed","succeeded","recovered"],"webhook":{{"url":"http://127.0.0.1:9/sim"}}}}]}}"#,
        dep.name,
        after.join(",")
    )
}

pub struct Outcome {
    pub runs: usize,
    pub faults: u64,
    /// A digest of every attempt started (run, attempt, worker, when) and
    /// every outcome recorded: equal for two runs of a seed exactly when
    /// the leaders made the same decisions at the same instants.
    pub digest: u64,
}

pub async fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::Builder::new().prefix("gnomon-sim").tempdir_in(sim_dir()).map_err(|e| e.to_string())?;
    let url = format!("sqlite://{}", dir.path().join("sim.db").display());
    let sqlite: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.map_err(|e| e.to_string())?);
    let clock = ManualClock::new(T0);
    let rates = FaultRates {
        write_before: rng.gen_range(0.0..0.08),
        write_after: rng.gen_range(0.0..0.08),
        read: rng.gen_range(0.0..0.05),
        delay: rng.gen_range(0.0..0.05),
        max_delay_ms: rng.gen_range(100..=3_000),
    };
    let store = Arc::new(FaultyStore::new(sqlite.clone(), clock.clone(), StdRng::seed_from_u64(seed ^ 0x5eed), rates));
    let mut h = History::default();

    let mut jobs = Vec::new();
    let periods: Vec<Millis> = (0..rng.gen_range(2..=4)).map(|_| [500, 1_000, 1_000, 2_000, 3_000][rng.gen_range(0..5)]).collect();
    // The slowest job, which the dependency jobs run after, always takes
    // webhook calls (with params), so keys and replays meet downstream runs.
    let slowest_i = (0..periods.len()).max_by_key(|&i| (periods[i], std::cmp::Reverse(i))).unwrap_or(0);
    for (i, &every_ms) in periods.iter().enumerate() {
        let name = format!("j{i}");
        let params = i == slowest_i || rng.gen_bool(0.5);
        let (schedule, start_at, end_at, jitter_ms) = schedule_json(every_ms, &mut rng);
        let timeout_ms = rng.gen_range(2..=6) * 1_000;
        let spec_json = job_json(&name, &schedule, params, timeout_ms, &mut rng);
        let json = spec_json.replace("ATTEMPTS", &rng.gen_range(2..=5).to_string());
        let compiled = parse_job_json(json.as_bytes()).map_err(|e| e.to_string())?.compile().map_err(|e| e.to_string())?;
        let rec = sqlite.put_job(&compiled.spec, Precondition::DoesNotExist, clock.now_millis()).await.map_err(|e| e.to_string())?;
        let schedule = compiled.schedule;
        jobs.push(SimJob {
            name,
            every_ms,
            created_at: rec.created_at,
            params,
            start_at,
            end_at,
            jitter_ms,
            schedule,
            timeout_ms,
            spec_json,
        });
    }
    // Dependency jobs: one after the slowest job (on a random outcome:
    // fan-out with the next), and one after the two slowest (a fan-in over
    // two timelines, at the instants they share) or after the first (a
    // chain). After the slowest, so that the workers keep up with the load
    // (a run waits in the queue as long as the load exceeds them, and every
    // run must end within `TERMINAL_WITHIN_MS`).
    use gnomon_core::deps::On;
    let ons = [On::Succeeded, On::Failed, On::Any];
    let mut by_period: Vec<&SimJob> = jobs.iter().collect();
    by_period.sort_by_key(|j| std::cmp::Reverse(j.every_ms));
    let (slowest, next) = (by_period[0].name.clone(), by_period[1].name.clone());
    let mut deps = vec![SimDep { name: "d0".into(), after: vec![(slowest.clone(), ons[rng.gen_range(0..3)])] }];
    let d1 = if rng.gen_bool(0.5) {
        vec![(slowest, ons[rng.gen_range(0..3)]), (next, ons[rng.gen_range(0..3)])]
    } else {
        vec![("d0".into(), ons[rng.gen_range(0..3)])]
    };
    deps.push(SimDep { name: "d1".into(), after: d1 });
    for dep in &deps {
        let spec = parse_job_json(dep_json(dep).as_bytes()).map_err(|e| e.to_string())?.compile().map_err(|e| e.to_string())?.spec;
        sqlite.put_job(&spec, Precondition::DoesNotExist, clock.now_millis()).await.map_err(|e| e.to_string())?;
    }
    // The store gives jobs random uids, and the leader breaks ties between
    // jobs by uid: fixed ones make a seed replay exactly.
    {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&url).await.map_err(|e| e.to_string())?;
        let uid = |name: &str| seed.wrapping_mul(31).wrapping_add(name.len() as u64 * 7 + name.as_bytes()[1] as u64);
        let names = jobs.iter().map(|j| (j.name.clone(), uid(&j.name)));
        let names = names.chain(deps.iter().enumerate().map(|(i, d)| (d.name.clone(), uid(&d.name).wrapping_add(1000 + i as u64))));
        for (name, uid) in names {
            sqlx::query("UPDATE jobs SET uid = ? WHERE name = ?")
                .bind(format!("{uid:016x}"))
                .bind(&name)
                .execute(&mut c)
                .await
                .map_err(|e| e.to_string())?;
        }
        let _ = c.close().await;
    }
    // Slots for the load with room to spare, so that a backlog left by the
    // faults drains within `TERMINAL_WITHIN_MS` (seeds 5072, 6395: busy
    // through the whole drain): the jobs' fires and the dependency runs
    // after the slowest, about a second an attempt (long ones included),
    // a third more for retries, doubled.
    let slowest = jobs.iter().map(|j| j.every_ms).max().unwrap_or(1_000).max(1) as f64;
    let per_second = jobs.iter().map(|j| 1_000.0 / j.every_ms.max(1) as f64).sum::<f64>() + 2_000.0 / slowest;
    let slots = (per_second * 1.3 * 2.0).ceil() as u32;
    let n = rng.gen_range(2..=3_u32);
    let each = slots.div_ceil(n).max(3);
    let mut workers: Vec<SimWorker> = (0..n).map(|i| SimWorker::new(format!("w{i}"), rng.gen_range(each..=each + 2), T0)).collect();

    let mut term = new_term(&store, &clock, seed).await;
    // A deposed leader that has not noticed yet: it keeps stepping.
    let mut zombie: Option<(Term, u32)> = None;
    let mut triggers: Vec<Trigger> = Vec::new();
    let end = T0 + FAULT_MS + DRAIN_MS;
    let faults_until = T0 + FAULT_MS;
    while clock.now_millis() < end {
        clock.advance(TICK);
        let now = clock.now_millis();
        let faulty = now < faults_until;
        if !faulty {
            store.set_faults(false);
        }
        for w in &mut workers {
            if faulty && w.is_up(now) {
                let roll: f64 = rng.gen();
                if roll < 0.002 {
                    w.crash(now, now + rng.gen_range(200..=4_000), &term.commands, &mut h);
                } else if roll < 0.004 {
                    w.pause(now, now + rng.gen_range(500..=LEASE_TTL_MS * 5 / 2), &mut h);
                } else if roll < 0.006 {
                    w.cut(now, &term.commands, &mut h);
                }
            }
            w.tick(now, &mut rng, &term.commands, &mut h);
        }
        if faulty {
            api_actions(&mut rng, &sqlite, &jobs, &term, &mut triggers, &mut h, now).await?;
            if rng.gen_bool(0.004) {
                let old = std::mem::replace(&mut term, new_term(&store, &clock, seed).await);
                h.note(now, "a new leader term".into());
                zombie = Some((old, rng.gen_range(0..6)));
            }
        }
        if let Some((z, left)) = zombie.as_mut() {
            let step = z.rt.step().await;
            *left = left.saturating_sub(1);
            if matches!(step, Step::Exit(_)) || *left == 0 {
                let _ = z.lost.send(true);
                zombie = None;
            }
        }
        if let Step::Exit(exit) = term.rt.step().await {
            return Err(format!("the current leader stopped: {exit:?}"));
        }
        triggers.retain_mut(|(keyed, expected, rx, withdraw)| match rx.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => match withdraw.take_if(|w| w.at <= now) {
                Some(w) => match w.claim.withdraw() {
                    Withdrawal::Withdrawn => {
                        h.note(now, format!("trigger {} withdrawn", w.tier));
                        h.withdrawn.push(w.tier);
                        false
                    }
                    // Planned first: its answer comes.
                    Withdrawal::Planned(_) => true,
                },
                None => true,
            },
            Ok(Ok(t)) => {
                if let (Some((job, key)), Some(id)) = (keyed.take(), t.ids.first()) {
                    h.keyed.push((job, key, id.clone(), t.existed));
                }
                if !t.existed {
                    h.trigger_params.push((t.ids.clone(), expected.0.take()));
                    h.trigger_payloads.push((t.ids.clone(), expected.1.take()));
                }
                false
            }
            Ok(Err(e)) => {
                if !matches!(e, TriggerError::Store(_)) {
                    h.refused_triggers.push(e.to_string());
                }
                false
            }
            Err(_) => false,
        });
    }
    h.close(clock.now_millis());
    let mut violations = store.violations();
    let runs = check::check(&*sqlite, &jobs, &deps, &h, end, &mut violations).await?;
    if !violations.is_empty() && std::env::var("GNOMON_SIM_SEED").is_ok() {
        for (t, what) in &h.log {
            eprintln!("{:>8} ms  {what}", t - T0);
        }
        let mut per_5s = std::collections::BTreeMap::new();
        for (_, _, w, t) in &h.starts {
            *per_5s.entry(((t - T0) / 5000 * 5, w.clone())).or_insert(0) += 1;
        }
        eprintln!("attempts started per 5 s and worker: {per_5s:?}");
    }
    if violations.is_empty() {
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (&h.starts, &h.recorded).hash(&mut hasher);
            hasher.finish()
        };
        Ok(Outcome { runs, faults: store.injected(), digest })
    } else {
        Err(violations.join("\n"))
    }
}

/// Where the simulation's databases go: memory-backed where there is one.
fn sim_dir() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Seeds that found defects: 24554, a job edited before its first fire
/// and first seen by a leader after the edit (its times before the edit
/// were dropped); 26023 and 34935, a job paused just after a time fell due
/// and resumed before it fired (the resume forgot it); 68301, a job paused,
/// resumed and paused again, loaded by a new leader (it fired the times of
/// the first pause); 131, a job paused, resumed and paused again before any
/// fire settled the resume, then resumed as a new term began (that leader
/// fired the times of the first pause: a resume now settles the timeline
/// when nothing was left to fire before the pause); 323638, a fan-in whose
/// upstreams were both being backfilled, skipped at an instant one
/// backfill had not reached yet (a running backfill now counts as a run to
/// come); 6691, a backfill whose range ran past its job's `end_at`, which
/// waited for ever for a timeline that had ended (an ended schedule now
/// counts as settled); 1021, a backfill asked too late at too low a rate
/// to end within the history (the simulation's own mistake: its backfills
/// now take at most half the time left); 13026, a worker whose attempt ended while it was away came back just
/// before the orphan's deadline without it in its Hello; the deadline
/// passed before its spooled report was read, and the attempt was ended
/// `lost` and run again (a returning worker's unlisted orphans now get a
/// lease for their reports).
const FOUND: [u64; 16] = [24554, 26023, 34935, 68301, 131, 323638, 6691, 1021, 798, 705, 1020, 2233, 899, 5072, 6395, 13026];

fn seeds(part: u64, parts: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("GNOMON_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return if part == 0 { vec![seed] } else { Vec::new() };
    }
    let n: u64 = std::env::var("GNOMON_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let first: u64 = std::env::var("GNOMON_SIM_FIRST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut seeds: Vec<u64> = (first..first.saturating_add(n)).collect();
    // Seeds that once found a defect run every time (the default range
    // does not reach them).
    if std::env::var("GNOMON_SIM_SEEDS").is_err() {
        seeds.extend(FOUND);
    }
    seeds.into_iter().filter(|s| s % parts == part).collect()
}

async fn run_seeds(part: u64) {
    // The leader's log, when asked for (RUST_LOG), to read a failing seed.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
    }
    let mut total_runs = 0;
    let mut total_faults = 0;
    let list = seeds(part, 2);
    for seed in &list {
        match run_seed(*seed).await {
            Ok(o) => {
                total_runs += o.runs;
                total_faults += o.faults;
            }
            Err(e) => panic!(
                "simulation seed {seed} failed:\n{e}\nreplay: GNOMON_SIM_SEED={seed} cargo test -p gnomon-server --test sim -- --nocapture"
            ),
        }
    }
    println!("simulation: {} seeds passed ({total_runs} runs, {total_faults} injected store faults)", list.len());
}

/// The leader is deterministic: its inputs (the clock, the store's
/// answers, the workers' messages, API commands and its seeded random
/// numbers, retry jitter included) fix every decision, so a seed run twice
/// makes the same history.
#[tokio::test]
async fn a_seed_replays_to_the_same_history() {
    for seed in [3, 11] {
        let (a, b) = (run_seed(seed).await.unwrap(), run_seed(seed).await.unwrap());
        assert_eq!((a.runs, a.faults, a.digest), (b.runs, b.faults, b.digest), "seed {seed} made another history the second time");
    }
}

#[tokio::test]
async fn simulation_even_seeds() {
    run_seeds(0).await;
}

#[tokio::test]
async fn simulation_odd_seeds() {
    run_seeds(1).await;
}
