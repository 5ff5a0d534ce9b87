//! The outbound side of a worker session: what the leader actor sends to one
//! worker, queued without ever blocking the actor, bounded, with heartbeat
//! acknowledgements coalesced.
//!
//! The actor sends on an unbounded channel that a forwarder drains at once
//! into this session's queue. A heartbeat ack (one that acknowledges no
//! report) supersedes any heartbeat ack still queued: the worker only needs
//! the newest, since each one proves that every heartbeat up to it was
//! seen. The superseded one is removed and the new one goes to the back, so
//! an ack never overtakes a message the leader sent before it. Every other
//! message (assignments, cancels, report acks) is kept. A worker that lets
//! [`MAX_QUEUED`] messages pile up (it stopped reading) has its session
//! closed: the stream ends at once, the backlog is dropped, and the worker
//! reconnects and reclaims its attempts or its lease runs out, as after a
//! lost connection. No message is dropped from a session that stays open.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use gnomon_proto::v1::{self, server_message};
use tokio::sync::mpsc;
use tonic::Status;

/// What the leader actor sends down a session to its worker.
pub type Outbound = mpsc::UnboundedSender<Result<v1::ServerMessage, Status>>;

/// Messages queued for one worker beyond which its session is closed.
pub const MAX_QUEUED: usize = 65_536;

/// The response stream of a session.
pub type SessionStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::ServerMessage, Status>> + Send>>;

type Item = Result<v1::ServerMessage, Status>;

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    /// Index in `items` of the queued heartbeat ack, counted from the number
    /// popped so far (`popped`) so that it survives pops.
    heartbeat_ack: Option<u64>,
    popped: u64,
    /// The forwarder ended: the actor dropped the session.
    ended: bool,
    /// The queue overflowed: end the stream now, dropping the backlog.
    closed: bool,
    waker: Option<Waker>,
}

fn is_heartbeat_ack(m: &Item) -> bool {
    matches!(m, Ok(v1::ServerMessage { msg: Some(server_message::Msg::Ack(a)) }) if a.heartbeat_seq.is_some() && a.report.is_none())
}

impl Queue {
    /// Queues `m`; false when the queue is full (the session must close).
    fn push(&mut self, m: Item) -> bool {
        if is_heartbeat_ack(&m) {
            if let Some(at) = self.heartbeat_ack.take() {
                // Only what was queued since the last heartbeat moves:
                // amortised O(1) per message.
                self.items.remove((at - self.popped) as usize);
                metrics::counter!("gnomon_session_acks_coalesced_total").increment(1);
            }
            self.heartbeat_ack = Some(self.popped + self.items.len() as u64);
        }
        if self.items.len() >= MAX_QUEUED {
            return false;
        }
        self.items.push_back(m);
        true
    }

    fn pop(&mut self) -> Option<Item> {
        let m = self.items.pop_front()?;
        if self.heartbeat_ack == Some(self.popped) {
            self.heartbeat_ack = None;
        }
        self.popped += 1;
        Some(m)
    }

    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// Moves what the actor sends into this session's bounded, coalescing queue
/// and returns the stream the worker reads.
pub fn bounded_stream(mut from_actor: mpsc::UnboundedReceiver<Item>, worker: String) -> SessionStream {
    let queue = Arc::new(Mutex::new(Queue::default()));
    let q = queue.clone();
    tokio::spawn(async move {
        while let Some(m) = from_actor.recv().await {
            let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
            if !q.push(m) {
                tracing::warn!(worker = %worker, queued = MAX_QUEUED, "worker does not read its session; closing it");
                metrics::counter!("gnomon_sessions_overflowed_total").increment(1);
                q.closed = true;
                q.items.clear();
                q.wake();
                // Dropping the receiver makes the actor's sends fail: it
                // treats the session as gone.
                return;
            }
            q.wake();
        }
        let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
        q.ended = true;
        q.wake();
    });
    Box::pin(Bounded { queue })
}

struct Bounded {
    queue: Arc<Mutex<Queue>>,
}

impl tokio_stream::Stream for Bounded {
    type Item = Item;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Option<Item>> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.closed {
            return Poll::Ready(None);
        }
        if let Some(m) = q.pop() {
            return Poll::Ready(Some(m));
        }
        if q.ended {
            return Poll::Ready(None);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // the stream item type is tonic's
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn ack(seq: u64) -> Item {
        Ok(v1::ServerMessage { msg: Some(server_message::Msg::Ack(v1::Ack { heartbeat_seq: Some(seq), ..Default::default() })) })
    }

    fn report_ack(run: &str) -> Item {
        let report = v1::AttemptRef { run_id: run.into(), attempt: 1 };
        Ok(v1::ServerMessage { msg: Some(server_message::Msg::Ack(v1::Ack { report: Some(report), ..Default::default() })) })
    }

    fn describe(m: &Item) -> String {
        match m.as_ref().unwrap().msg.as_ref().unwrap() {
            server_message::Msg::Ack(v1::Ack { report: Some(r), .. }) => format!("report {}", r.run_id),
            server_message::Msg::Ack(a) => format!("hb {}", a.heartbeat_seq.unwrap()),
            _ => "other".into(),
        }
    }

    async fn drain(mut stream: SessionStream) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(m) = stream.next().await {
            seen.push(describe(&m));
        }
        seen
    }

    #[tokio::test]
    async fn a_session_passes_everything_in_order_while_it_is_read() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut stream = bounded_stream(rx, "w".into());
        for i in 0..1000 {
            tx.send(report_ack(&i.to_string())).unwrap();
            // Read each one before the next: nothing is coalesced.
            let m = stream.next().await.unwrap();
            assert_eq!(describe(&m), format!("report {i}"));
            tx.send(ack(i)).unwrap();
            assert_eq!(describe(&stream.next().await.unwrap()), format!("hb {i}"));
        }
        drop(tx);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn queued_heartbeat_acks_coalesce_to_the_newest_behind_what_came_before_it() {
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = bounded_stream(rx, "w".into());
        tx.send(ack(1)).unwrap();
        tx.send(report_ack("a")).unwrap();
        tx.send(ack(2)).unwrap();
        tx.send(report_ack("b")).unwrap();
        tx.send(ack(3)).unwrap();
        tx.send(report_ack("c")).unwrap();
        drop(tx);
        assert_eq!(drain(stream).await, ["report a", "report b", "hb 3", "report c"]);
    }

    #[test]
    fn a_flood_of_heartbeats_never_fills_the_queue() {
        let mut q = Queue::default();
        assert!(q.push(report_ack("a")));
        for i in 0..(3 * MAX_QUEUED as u64) {
            assert!(q.push(ack(i)), "heartbeat ack {i} was refused");
            assert_eq!(q.items.len(), 2);
        }
        assert_eq!(describe(&q.pop().unwrap()), "report a");
        assert_eq!(describe(&q.pop().unwrap()), format!("hb {}", 3 * MAX_QUEUED as u64 - 1));
        assert!(q.pop().is_none());
        // After a pop the next heartbeat ack is queued afresh.
        assert!(q.push(ack(1)) && q.push(report_ack("b")) && q.push(ack(2)));
        let rest: Vec<_> = std::iter::from_fn(|| q.pop()).map(|m| describe(&m)).collect();
        assert_eq!(rest, ["report b", "hb 2"]);
    }

    #[tokio::test]
    async fn a_worker_that_stops_reading_has_its_session_closed() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut stream = bounded_stream(rx, "w".into());
        for i in 0..(MAX_QUEUED as u64 + 10) {
            tx.send(report_ack(&i.to_string())).unwrap();
        }
        // The forwarder sees the queue full, closes the session: the actor's
        // sends fail and the stream ends without delivering the backlog.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while !tx.is_closed() {
            assert!(tokio::time::Instant::now() < deadline, "the session was closed");
            tokio::task::yield_now().await;
        }
        assert!(stream.next().await.is_none());
    }
}
