//! A simulated worker that follows the worker protocol's rules: it opens a
//! session with a `Hello` listing what it runs, heartbeats, runs what it is
//! assigned (never while its fence has lapsed: no heartbeat acknowledged
//! within 0.7 × the lease, counted from when that heartbeat was sent),
//! reports into a spool kept until acked and re-sent on reconnect, and
//! fences itself. Faults: it crashes (its attempts die, its spool survives),
//! freezes (a paused process does nothing, then fences itself first thing
//! on waking if its fence lapsed meanwhile) and loses its connection.

use std::collections::{BTreeMap, HashMap};

use gnomon_core::Millis;
use gnomon_proto::v1::{self, server_message, worker_message};
use gnomon_proto::PROTOCOL_VERSION;
use gnomon_server::leader::LeaderCommand;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::{mpsc, oneshot};

use crate::history::History;

type Inbound = mpsc::UnboundedReceiver<Result<v1::ServerMessage, tonic::Status>>;

struct Session {
    rx: Inbound,
    reply: Option<oneshot::Receiver<Result<String, tonic::Status>>>,
    id: Option<String>,
}

struct Attempt {
    ends_at: Millis,
    succeeds: bool,
    started_at: Millis,
    token: u64,
    /// A failure's hint: `(no_retry, retry_after_ms)`.
    hint: (bool, u64),
    /// Output bytes streamed so far.
    written: u64,
    /// It runs past its job's timeout: it ends `timed_out` at the timeout.
    times_out: bool,
}

pub struct SimWorker {
    pub id: String,
    capacity: u32,
    session: Option<Session>,
    running: BTreeMap<(String, u32), Attempt>,
    spool: BTreeMap<(String, u32), v1::Report>,
    /// When the newest acknowledged heartbeat was sent.
    last_ack: Millis,
    sent: HashMap<u64, Millis>,
    ttl: Millis,
    heartbeat_every: Millis,
    next_heartbeat: Millis,
    seq: u64,
    max_token: u64,
    paused_until: Option<Millis>,
    down_until: Option<Millis>,
    reconnect_at: Millis,
    /// When the current session's Hello was sent: its lease starts no
    /// earlier on the leader.
    hello_sent: Millis,
    now: Millis,
}

impl SimWorker {
    pub fn new(id: String, capacity: u32, now: Millis) -> Self {
        Self {
            id,
            capacity,
            session: None,
            running: BTreeMap::new(),
            spool: BTreeMap::new(),
            last_ack: now,
            sent: HashMap::new(),
            ttl: 5_000,
            heartbeat_every: 1_000,
            next_heartbeat: now,
            seq: 0,
            max_token: 0,
            paused_until: None,
            down_until: None,
            reconnect_at: now,
            hello_sent: now,
            now,
        }
    }

    pub fn is_up(&self, now: Millis) -> bool {
        self.paused_until.is_none_or(|t| t <= now) && self.down_until.is_none_or(|t| t <= now)
    }

    fn fence_lapsed(&self, now: Millis) -> bool {
        now - self.last_ack > self.ttl * 7 / 10
    }

    fn send(&self, commands: &mpsc::Sender<LeaderCommand>, msg: worker_message::Msg) {
        if let Some(session) = self.session.as_ref().and_then(|s| s.id.clone()) {
            let _ = commands.try_send(LeaderCommand::FromWorker { session, msg });
        }
    }

    /// Kills the process: attempts die with it; the spool is on disk.
    pub fn crash(&mut self, now: Millis, until: Millis, commands: &mpsc::Sender<LeaderCommand>, h: &mut History) {
        h.note(now, format!("worker {} crashed until {}", self.id, until - crate::T0));
        h.disrupted(&self.id, now, until);
        for (key, _) in std::mem::take(&mut self.running) {
            h.end_live(&key.0, key.1, now);
        }
        self.drop_session(commands);
        self.down_until = Some(until);
    }

    /// Freezes the process (SIGSTOP): nothing it runs makes progress.
    pub fn pause(&mut self, now: Millis, until: Millis, h: &mut History) {
        h.note(now, format!("worker {} paused until {}", self.id, until - crate::T0));
        h.disrupted(&self.id, now, until);
        for key in self.running.keys() {
            h.end_live(&key.0, key.1, now);
        }
        self.paused_until = Some(until);
    }

    /// The connection breaks; the process and its attempts go on.
    pub fn cut(&mut self, now: Millis, commands: &mpsc::Sender<LeaderCommand>, h: &mut History) {
        h.note(now, format!("worker {} cut off", self.id));
        h.disrupted(&self.id, now, now + 500);
        self.drop_session(commands);
        self.reconnect_at = now + 500;
    }

    fn drop_session(&mut self, commands: &mpsc::Sender<LeaderCommand>) {
        if let Some(id) = self.session.take().and_then(|s| s.id) {
            let _ = commands.try_send(LeaderCommand::SessionClosed { session: id });
        }
    }

    fn report(
        &mut self,
        key: (String, u32),
        a: &Attempt,
        outcome: v1::Outcome,
        now: Millis,
        commands: &mpsc::Sender<LeaderCommand>,
        h: &mut History,
    ) {
        let failed = outcome == v1::Outcome::Failed;
        h.decided.push((key.0.clone(), key.1, outcome as i32));
        if failed && (a.hint.0 || a.hint.1 > 0) {
            h.hints.push((key.0.clone(), key.1, a.hint.0, a.hint.1));
        }
        let report = v1::Report {
            run_id: key.0.clone(),
            attempt: key.1,
            outcome: outcome as i32,
            exit_code: Some(if outcome == v1::Outcome::Succeeded { 0 } else { 1 }),
            started_at_ms: a.started_at,
            ended_at_ms: now,
            token: a.token,
            no_retry: failed && a.hint.0,
            retry_after_ms: if failed { a.hint.1 } else { 0 },
            ..Default::default()
        };
        self.spool.insert(key, report.clone());
        self.send(commands, worker_message::Msg::Report(report));
    }

    pub fn tick(&mut self, now: Millis, rng: &mut StdRng, commands: &mpsc::Sender<LeaderCommand>, h: &mut History) {
        self.now = now;
        if let Some(until) = self.down_until {
            if now < until {
                return;
            }
            // Restarted: a new process with nothing running.
            self.down_until = None;
            self.session = None;
            self.last_ack = now - self.ttl;
        }
        if let Some(until) = self.paused_until {
            if now < until {
                return;
            }
            self.paused_until = None;
            // Awake: the watchdog's first look.
            if self.fence_lapsed(now) {
                self.fence_all(now, commands, h);
            } else {
                for key in self.running.keys() {
                    h.resume_live(&key.0, key.1, now);
                }
            }
        }
        if self.session.is_none() && now >= self.reconnect_at {
            self.connect(commands);
        }
        self.read_messages(now, rng, commands, h);
        if self.fence_lapsed(now) && !self.running.is_empty() {
            // A worker's watchdog stops its attempts at the deadline, not
            // at the simulation's next look (the clock may have jumped past
            // it in one slow store call of the leader's; seed 2233).
            let deadline = (self.last_ack + self.ttl * 7 / 10).min(now);
            self.fence_all(deadline, commands, h);
        }
        // Running attempts write a line now and then, streamed as it
        // would be.
        let pieces: Vec<v1::Output> = self
            .running
            .iter_mut()
            .filter(|_| rng.gen_bool(0.05))
            .map(|((run, attempt), a)| {
                let data = format!("line at {now}\n").into_bytes();
                let offset = a.written;
                a.written += data.len() as u64;
                v1::Output { run_id: run.clone(), attempt: *attempt, token: a.token, offset, data }
            })
            .collect();
        for p in pieces {
            self.send(commands, worker_message::Msg::Output(p));
        }
        // Attempts that are done.
        let done: Vec<(String, u32)> = self.running.iter().filter(|(_, a)| a.ends_at <= now).map(|(k, _)| k.clone()).collect();
        for key in done {
            if let Some(a) = self.running.remove(&key) {
                h.end_live(&key.0, key.1, now);
                let outcome = match (a.times_out, a.succeeds) {
                    (true, _) => v1::Outcome::TimedOut,
                    (false, true) => v1::Outcome::Succeeded,
                    (false, false) => v1::Outcome::Failed,
                };
                self.report(key, &a, outcome, now, commands, h);
            }
        }
        if self.session.as_ref().is_some_and(|s| s.id.is_some()) && now >= self.next_heartbeat {
            self.seq += 1;
            self.sent.insert(self.seq, now);
            let attempts = self.running.keys().map(|k| v1::AttemptRef { run_id: k.0.clone(), attempt: k.1 }).collect();
            let hb = v1::Heartbeat { seq: self.seq, attempts, running: self.running.len() as u32, ..Default::default() };
            self.send(commands, worker_message::Msg::Heartbeat(hb));
            self.next_heartbeat = now + self.heartbeat_every;
        }
    }

    /// Stops every running attempt at `now` (the watchdog's deadline, or
    /// when a paused worker wakes past it) and reports each lost.
    fn fence_all(&mut self, now: Millis, commands: &mpsc::Sender<LeaderCommand>, h: &mut History) {
        if !self.running.is_empty() {
            h.note(now, format!("worker {} fenced itself", self.id));
            h.self_fences.push((self.id.clone(), now));
        }
        for (key, a) in std::mem::take(&mut self.running) {
            h.end_live(&key.0, key.1, now);
            self.report(key, &a, v1::Outcome::Lost, now, commands, h);
        }
    }

    fn connect(&mut self, commands: &mpsc::Sender<LeaderCommand>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        let hello = v1::Hello {
            worker_id: self.id.clone(),
            capacity: self.capacity,
            executors: vec!["handler".into()],
            handlers: vec!["noop".into()],
            running: self.running.keys().map(|k| v1::AttemptRef { run_id: k.0.clone(), attempt: k.1 }).collect(),
            protocol_version: PROTOCOL_VERSION,
            ..Default::default()
        };
        self.hello_sent = self.now;
        if commands.try_send(LeaderCommand::SessionOpen { hello: Box::new(hello), namespaces: None, outbound: tx, reply }).is_ok() {
            self.session = Some(Session { rx, reply: Some(answer), id: None });
        }
    }

    fn read_messages(&mut self, now: Millis, rng: &mut StdRng, commands: &mpsc::Sender<LeaderCommand>, h: &mut History) {
        let Some(session) = self.session.as_mut() else { return };
        if let Some(reply) = session.reply.as_mut() {
            match reply.try_recv() {
                Ok(Ok(id)) => {
                    session.id = Some(id);
                    session.reply = None;
                }
                Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {
                    self.session = None;
                    self.reconnect_at = now + 500;
                    return;
                }
                Err(oneshot::error::TryRecvError::Empty) => return,
            }
        }
        let mut messages = Vec::new();
        let mut closed = false;
        loop {
            match session.rx.try_recv() {
                Ok(Ok(m)) => messages.extend(m.msg),
                Ok(Err(_)) | Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        for m in messages {
            self.handle(m, now, rng, commands, h);
        }
        if closed {
            self.session = None;
            self.reconnect_at = now + 200;
        }
    }

    fn handle(&mut self, m: server_message::Msg, now: Millis, rng: &mut StdRng, commands: &mpsc::Sender<LeaderCommand>, h: &mut History) {
        match m {
            server_message::Msg::Welcome(w) => {
                self.max_token = self.max_token.max(w.leader_token);
                self.ttl = w.lease_ttl_ms as Millis;
                self.heartbeat_every = w.heartbeat_interval_ms as Millis;
                // The session's lease runs from the leader's receipt of the
                // Hello: counted from its sending, not from this Welcome's
                // arrival (which a freeze can delay past that lease).
                self.last_ack = self.last_ack.max(self.hello_sent);
                for r in w.superseded {
                    if self.running.remove(&(r.run_id.clone(), r.attempt)).is_some() {
                        h.end_live(&r.run_id, r.attempt, now);
                    }
                }
                // The session id came with the reply, read before this.
                let spooled: Vec<v1::Report> = self.spool.values().cloned().collect();
                for r in spooled {
                    self.send(commands, worker_message::Msg::Report(r));
                }
            }
            server_message::Msg::Assign(a) => {
                if a.token < self.max_token {
                    return;
                }
                self.max_token = a.token;
                let key = (a.run_id.clone(), a.attempt);
                // Never start while the fence has lapsed; drop, not queue.
                if self.fence_lapsed(now) || self.running.contains_key(&key) || self.spool.contains_key(&key) {
                    return;
                }
                h.start(&a.run_id, a.attempt, &self.id, now);
                h.assigned_params.push((a.run_id.clone(), a.attempt, a.params_json.clone()));
                h.assigned_payloads.push((a.run_id.clone(), a.attempt, a.payload.clone()));
                // Most attempts are short; some run for seconds, through
                // failovers, and some of those past their job's timeout
                // (the worker then ends them `timed_out` at the timeout).
                let runs_for = if rng.gen_bool(0.15) { rng.gen_range(1_000..=7_000) } else { rng.gen_range(20..=400) };
                let timeout = Millis::try_from(a.timeout_ms).unwrap_or(Millis::MAX);
                let times_out = a.timeout_ms > 0 && runs_for > timeout;
                let ends_at = now + if times_out { timeout } else { runs_for };
                let succeeds = rng.gen_bool(0.8);
                // A failure may ask not to be retried, or to be retried
                // later than its backoff (an SDK handler's NonRetryable,
                // RetryAfter).
                let hint = match rng.gen_range(0..4) {
                    0 => (true, 0),
                    1 => (false, rng.gen_range(100..=3_000)),
                    _ => (false, 0),
                };
                self.running.insert(key, Attempt { ends_at, succeeds, started_at: now, token: a.token, hint, written: 0, times_out });
                // Its start, as a worker reports it (the leader measures
                // the timeout from here).
                self.send(
                    commands,
                    worker_message::Msg::Started(v1::Started { run_id: a.run_id.clone(), attempt: a.attempt, started_at_ms: now }),
                );
            }
            server_message::Msg::Cancel(c) => {
                if c.token < self.max_token {
                    return;
                }
                let key = (c.run_id.clone(), c.attempt);
                if let Some(a) = self.running.remove(&key) {
                    h.end_live(&key.0, key.1, now);
                    self.report(key, &a, v1::Outcome::Cancelled, now, commands, h);
                }
            }
            server_message::Msg::Abort(a) => {
                if a.token < self.max_token {
                    return;
                }
                let key = (a.run_id.clone(), a.attempt);
                if self.running.remove(&key).is_some() {
                    h.end_live(&key.0, key.1, now);
                }
                self.spool.remove(&key);
            }
            server_message::Msg::Ack(ack) => {
                if let Some(seq) = ack.heartbeat_seq {
                    if let Some(sent) = self.sent.remove(&seq) {
                        self.last_ack = self.last_ack.max(sent);
                    }
                    self.sent.retain(|s, _| *s > seq);
                }
                if let Some(r) = ack.report {
                    let key = (r.run_id.clone(), r.attempt);
                    if let Some(report) = self.spool.remove(&key) {
                        if ack.rejected_reason.is_empty() {
                            h.recorded(&r.run_id, r.attempt, report.outcome);
                        }
                    }
                }
            }
            server_message::Msg::NotLeader(_) => {}
        }
    }
}
