//! The connection loop: one gRPC session at a time to one of the servers,
//! `NotLeader` redirects, reconnects with jittered backoff, and the drain.

use std::time::{Duration, Instant};

use gnomon_proto::v1::{self, server_message, worker_client::WorkerClient, worker_message};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::*;

impl WorkerRuntime {
    /// Runs sessions until `shutdown` turns true and the drain is done.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // Self-fencing watchdog.
        let watchdog = {
            let rt = self.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if rt.fence_lapsed() {
                        rt.fence_self("no heartbeat acked within the safety fraction of the lease");
                    }
                }
            })
        };
        let mut backoff = Duration::from_millis(100);
        let mut next = 0usize;
        let mut redirect: Option<String> = None;
        let mut drain_deadline: Option<Instant> = None;
        loop {
            if *shutdown.borrow() && drain_deadline.is_none() {
                drain_deadline = Some(Instant::now() + self.config.drain_timeout);
                self.lock().draining = true;
            }
            if let Some(deadline) = drain_deadline {
                if Instant::now() >= deadline {
                    self.fence_self("drain timeout");
                }
                let (running, unacked) = (self.running(), self.unacked());
                if running == 0 && (unacked == 0 || Instant::now() >= deadline + Duration::from_secs(5)) {
                    break;
                }
            }
            let addr = redirect.take().unwrap_or_else(|| {
                let a = self.config.servers[next % self.config.servers.len().max(1)].clone();
                next += 1;
                a
            });
            let welcomed = self.lock().welcomes;
            let end = self.session(&addr, &mut shutdown, &mut drain_deadline).await;
            // After a session that was established, reconnect quickly again:
            // a worker must find a new leader well within its lease.
            if self.lock().welcomes != welcomed {
                backoff = Duration::from_millis(100);
            }
            match end {
                SessionEnd::Redirect(to) => {
                    tracing::info!(from = %addr, to = %to, "not the leader; following the redirect");
                    redirect = Some(to);
                    backoff = Duration::from_millis(100);
                    continue;
                }
                SessionEnd::Refused(why) => tracing::error!(server = %addr, why, "session refused"),
                SessionEnd::Lost(why) => tracing::warn!(server = %addr, why, "session ended; reconnecting"),
                SessionEnd::Drained => break,
            }
            let jitter = rand::random::<f64>() * 0.3 + 0.85;
            tokio::select! {
                _ = tokio::time::sleep(backoff.mul_f64(jitter)) => {}
                _ = shutdown.changed() => {}
            }
            // Capped at 2 s: a worker must be back well within a new
            // leader's lease TTL to reclaim its running attempts.
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        watchdog.abort();
        tracing::info!(worker = %self.config.id, "worker stopped");
    }

    async fn session(&self, addr: &str, shutdown: &mut watch::Receiver<bool>, drain_deadline: &mut Option<Instant>) -> SessionEnd {
        let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
            Ok(e) => e
                .connect_timeout(Duration::from_secs(3))
                .http2_keep_alive_interval(Duration::from_secs(2))
                .keep_alive_timeout(Duration::from_secs(3)),
            Err(e) => return SessionEnd::Refused(format!("bad server address {addr:?}: {e}")),
        };
        let connected = match &self.config.tls {
            None => endpoint.connect().await.map_err(|e| crate::error_chain(&e)),
            Some(tls) => match super::tls::client_config(tls) {
                Ok(config) => super::tls::connect(endpoint, addr, config).await,
                Err(e) => Err(e),
            },
        };
        let channel = match connected {
            Ok(c) => c,
            Err(e) => return SessionEnd::Lost(format!("connect: {e}")),
        };
        let mut client = WorkerClient::new(channel).max_decoding_message_size(8 << 20);
        let (tx, rx) = mpsc::unbounded_channel::<v1::WorkerMessage>();
        // The session's lease starts when the leader receives this Hello,
        // so the fence counts from its sending: a worker frozen before it
        // reads the Welcome must not count from the Welcome's late arrival.
        let hello_sent = Instant::now();
        let _ = tx.send(msg(worker_message::Msg::Hello(self.hello())));
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Some(token) = &self.config.token {
            if let Ok(v) = format!("Bearer {token}").parse() {
                request.metadata_mut().insert("authorization", v);
            }
        }
        let mut inbound = match client.session(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => return SessionEnd::from_status(&status),
        };
        let welcome = match inbound.message().await {
            Ok(Some(v1::ServerMessage { msg: Some(server_message::Msg::Welcome(w)) })) => w,
            Ok(Some(v1::ServerMessage { msg: Some(server_message::Msg::NotLeader(n)) })) => {
                return if n.leader_address.is_empty() || n.leader_address == addr {
                    SessionEnd::Lost("no leader yet".into())
                } else {
                    SessionEnd::Redirect(n.leader_address)
                };
            }
            Ok(_) => return SessionEnd::Lost("the server did not answer Hello".into()),
            Err(status) => return SessionEnd::from_status(&status),
        };
        for r in &welcome.superseded {
            self.stop_attempt(&r.run_id, r.attempt, None);
        }
        let heartbeat_every = Duration::from_millis(welcome.heartbeat_interval_ms.max(50));
        {
            let mut inner = self.lock();
            inner.max_token = inner.max_token.max(welcome.leader_token);
            inner.lease_ttl = Duration::from_millis(welcome.lease_ttl_ms.max(500));
            inner.last_ack = inner.last_ack.max(hello_sent);
            inner.heartbeats_sent.clear();
            inner.welcomes += 1;
            inner.outbound = Some(tx.clone());
            for r in inner.spool.values() {
                let _ = tx.send(msg(worker_message::Msg::Report(r.clone())));
            }
        }
        tracing::info!(server = %addr, session = %welcome.session_id, token = welcome.leader_token, "session established");
        let mut seq = 0u64;
        let mut ticker = tokio::time::interval(heartbeat_every);
        let mut live_ticker = tokio::time::interval(crate::live::LIVE_FLUSH_EVERY);
        let end = loop {
            tokio::select! {
                _ = live_ticker.tick() => self.flush_live(),
                _ = ticker.tick() => {
                    seq += 1;
                    let (held, attempts, draining) = {
                        let inner = self.lock();
                        let attempts: Vec<v1::AttemptRef> =
                            inner.running.keys().map(|k| v1::AttemptRef { run_id: k.0.clone(), attempt: k.1 }).collect();
                        (inner.running.len() as u32, attempts, inner.draining)
                    };
                    let running = self.executing() as u32;
                    let queued = held.saturating_sub(running);
                    let load = f64::from(running) / f64::from(self.config.capacity.max(1));
                    let hb = v1::Heartbeat { seq, running, load, attempts, draining, queued };
                    self.lock().heartbeats_sent.insert(seq, Instant::now());
                    if tx.send(msg(worker_message::Msg::Heartbeat(hb))).is_err() {
                        break SessionEnd::Lost("outbound queue closed".into());
                    }
                    if let Some(deadline) = *drain_deadline {
                        if Instant::now() >= deadline {
                            self.fence_self("drain timeout");
                        }
                        if self.running() == 0 && self.unacked() == 0 {
                            break SessionEnd::Drained;
                        }
                        if self.running() == 0 && Instant::now() >= deadline + Duration::from_secs(5) {
                            break SessionEnd::Drained;
                        }
                    }
                }
                m = inbound.message() => match m {
                    Ok(Some(v1::ServerMessage { msg: Some(m) })) => self.handle(m),
                    Ok(Some(_)) => {}
                    Ok(None) => break SessionEnd::Lost("the server closed the session".into()),
                    Err(status) => break SessionEnd::Lost(status.to_string()),
                },
                _ = shutdown.changed(), if drain_deadline.is_none() => {
                    *drain_deadline = Some(Instant::now() + self.config.drain_timeout);
                    self.lock().draining = true;
                    tracing::info!(running = self.running(), "draining: no new assignments; waiting for running attempts");
                }
            }
        };
        self.lock().outbound = None;
        end
    }
}

enum SessionEnd {
    Redirect(String),
    Refused(String),
    Lost(String),
    Drained,
}

impl SessionEnd {
    /// A refusal (bad Hello, duplicate id, auth) or a transient loss.
    fn from_status(status: &tonic::Status) -> SessionEnd {
        match status.code() {
            tonic::Code::FailedPrecondition
            | tonic::Code::InvalidArgument
            | tonic::Code::AlreadyExists
            | tonic::Code::Unauthenticated
            | tonic::Code::PermissionDenied => SessionEnd::Refused(status.message().to_string()),
            _ => SessionEnd::Lost(status.to_string()),
        }
    }
}
