//! When the etcd store repeats a request, and how long it waits between tries.
//!
//! - **Reads** ([`READS`]): at most 5 tries, waiting 100, 200, 400 and
//!   800 ms between them (doubling from 100 ms, capped at 1 s), and only
//!   after an error that a later try may not repeat ([`retryable_read`]:
//!   the member is unavailable, the connection broke, the request timed
//!   out inside etcd, etcd sheds load). A read that gets no answer within
//!   3 s is not retried (a partition: retrying would only make the caller
//!   wait longer); any other error (refused, too large, invalid) returns at
//!   once.
//! - **Writes** ([`WRITES`]): at most 5 tries, waiting 50, 100, 200 and
//!   400 ms, and only after an error proving that the request never left
//!   this process ([`never_sent`]: the client could not connect to the
//!   member it picked). Any other error — the connection broke, the member
//!   answered unavailable, no answer within 10 s — may come after etcd
//!   applied the write, so it goes back to the caller, which re-reads to
//!   learn the outcome (the CAS loops); resending could apply it twice.
//!
//! Both loops take the sleep as a parameter, so tests record the delays
//! instead of waiting for them.

use std::future::Future;
use std::time::Duration;

use crate::StoreError;

/// How often and how patiently one kind of request is repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Tries in all, the first included.
    pub tries: u32,
    /// The wait after the first failed try; each later wait doubles it…
    pub first_delay: Duration,
    /// …up to this.
    pub max_delay: Duration,
    /// How long one try may go unanswered before the request is given up
    /// (never retried: its outcome, for a write, is unknown).
    pub answer_within: Duration,
}

/// Reads: 5 tries, 100 → 200 → 400 → 800 ms between them, 3 s per try.
pub(crate) const READS: RetryPolicy = RetryPolicy {
    tries: 5,
    first_delay: Duration::from_millis(100),
    max_delay: Duration::from_secs(1),
    answer_within: Duration::from_secs(3),
};

/// Writes: 5 tries, 50 → 100 → 200 → 400 ms between them, 10 s per try,
/// repeated only after [`never_sent`] errors.
pub(crate) const WRITES: RetryPolicy = RetryPolicy {
    tries: 5,
    first_delay: Duration::from_millis(50),
    max_delay: Duration::from_secs(1),
    answer_within: Duration::from_secs(10),
};

impl RetryPolicy {
    /// The waits between tries, in order (one fewer than `tries`).
    pub fn delays(&self) -> Vec<Duration> {
        let mut d = self.first_delay;
        (1..self.tries)
            .map(|_| {
                let this = d.min(self.max_delay);
                d = d.saturating_mul(2);
                this
            })
            .collect()
    }
}

/// gRPC status codes (`tonic::Code` as numbers).
const UNKNOWN: i32 = 2;
const DEADLINE_EXCEEDED: i32 = 4;
const RESOURCE_EXHAUSTED: i32 = 8;
const ABORTED: i32 = 10;
const UNAVAILABLE: i32 = 14;

/// May a later try of a read succeed where this one failed? Yes for a
/// member that is unavailable (down, no leader, leader changed), a broken
/// connection (the client reports it as UNKNOWN "transport error"), a
/// request that timed out inside etcd, or etcd shedding load ("too many
/// requests"); no for anything etcd would answer the same way again
/// (permission denied, invalid or too large a request, a compacted
/// revision, no space).
pub(crate) fn retryable_read(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => match s.code() as i32 {
            UNKNOWN | DEADLINE_EXCEEDED | ABORTED | UNAVAILABLE => true,
            RESOURCE_EXHAUSTED => s.message().contains("too many requests"),
            _ => false,
        },
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// Did this error happen before the request left this process? Only a
/// failed TCP connect proves it (gRPC UNAVAILABLE carrying the connector's
/// "tcp connect error"): nothing was sent on a connection that never
/// opened. A broken connection, a reset, an UNAVAILABLE answer from etcd
/// ("leader changed", "request timed out") and everything else may follow
/// a write etcd applied.
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() as i32 == UNAVAILABLE && s.message().contains("tcp connect error"))
}

fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

/// Calls an idempotent read under [`READS`].
pub(crate) async fn retry_read<T, F, Fut>(f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    retry_read_with(&READS, tokio::time::sleep, f).await
}

/// Calls an idempotent read until it answers, under `policy`, waiting with
/// `sleep` between tries (see the module docs).
pub(crate) async fn retry_read_with<T, F, Fut, S, SFut>(policy: &RetryPolicy, mut sleep: S, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
    S: FnMut(Duration) -> SFut,
    SFut: Future<Output = ()>,
{
    let mut delays = policy.delays().into_iter();
    loop {
        let e = match tokio::time::timeout(policy.answer_within, f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            // Silence, not an error: a partition. Retrying would only make
            // the caller (an API request, a leader turn) wait longer.
            Err(_) => return Err(StoreError::Unavailable(format!("etcd: no answer within {:?}", policy.answer_within))),
        };
        match delays.next() {
            Some(d) if retryable_read(&e) => sleep(d).await,
            _ => return Err(unavailable(e)),
        }
    }
}

/// Sends one write under [`WRITES`].
pub(crate) async fn send_write<T, F, Fut>(f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    send_write_with(&WRITES, never_sent, tokio::time::sleep, f).await
}

/// Sends one write, repeating it under `policy` only while `unsent` says
/// the failed try never left this process (see the module docs).
pub(crate) async fn send_write_with<T, F, Fut, S, SFut>(
    policy: &RetryPolicy,
    unsent: fn(&etcd_client::Error) -> bool,
    mut sleep: S,
    mut f: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
    S: FnMut(Duration) -> SFut,
    SFut: Future<Output = ()>,
{
    let mut delays = policy.delays().into_iter();
    loop {
        let e = match tokio::time::timeout(policy.answer_within, f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            Err(_) => return Err(StoreError::Unavailable("etcd: txn timed out (its outcome is re-checked by the caller)".into())),
        };
        match delays.next() {
            Some(d) if unsent(&e) => sleep(d).await,
            _ => return Err(unavailable(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;

    fn status(code: tonic::Code, msg: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg))
    }

    /// A sleep that records what it was asked to wait, and does not wait.
    fn recorder() -> (Arc<Mutex<Vec<Duration>>>, impl FnMut(Duration) -> std::future::Ready<()>) {
        let waits = Arc::new(Mutex::new(Vec::new()));
        let w = waits.clone();
        (waits, move |d| {
            w.lock().unwrap().push(d);
            std::future::ready(())
        })
    }

    #[test]
    fn the_policies_state_their_numbers() {
        let ms = |v: &[u64]| v.iter().map(|m| Duration::from_millis(*m)).collect::<Vec<_>>();
        assert_eq!(READS.delays(), ms(&[100, 200, 400, 800]));
        assert_eq!(WRITES.delays(), ms(&[50, 100, 200, 400]));
        let long = RetryPolicy { tries: 7, ..READS };
        assert_eq!(long.delays(), ms(&[100, 200, 400, 800, 1000, 1000]), "capped at max_delay");
    }

    #[tokio::test]
    async fn a_read_stops_after_five_tries_with_its_backoff() {
        let calls = AtomicU32::new(0);
        let (waits, sleep) = recorder();
        let r: Result<(), _> = retry_read_with(&READS, sleep, || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err(status(tonic::Code::Unavailable, "etcdserver: leader changed")))
        })
        .await;
        assert!(matches!(r, Err(StoreError::Unavailable(ref m)) if m.contains("leader changed")), "{r:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        let ms: Vec<u128> = waits.lock().unwrap().iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 400, 800], "no wait after the last try");
    }

    #[test]
    fn reads_are_retried_after_errors_a_later_try_may_not_repeat() {
        for again in [
            status(tonic::Code::Unavailable, "etcdserver: leader changed"),
            status(tonic::Code::Unknown, "transport error"),
            status(tonic::Code::DeadlineExceeded, "context deadline exceeded"),
            status(tonic::Code::ResourceExhausted, "etcdserver: too many requests"),
        ] {
            assert!(retryable_read(&again), "{again}");
        }
        for same in [
            status(tonic::Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded"),
            status(tonic::Code::InvalidArgument, "etcdserver: request is too large"),
            status(tonic::Code::PermissionDenied, "etcdserver: permission denied"),
        ] {
            assert!(!retryable_read(&same), "{same}");
        }
    }

    #[tokio::test]
    async fn a_read_that_recovers_returns_its_answer() {
        let calls = AtomicU32::new(0);
        let (waits, sleep) = recorder();
        let r = retry_read_with(&READS, sleep, || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(if n < 2 { Err(status(tonic::Code::DeadlineExceeded, "slow")) } else { Ok(n) })
        })
        .await;
        assert_eq!(r.unwrap(), 2);
        assert_eq!(waits.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_non_retryable_read_error_returns_at_once() {
        for e in [
            status(tonic::Code::PermissionDenied, "etcdserver: permission denied"),
            status(tonic::Code::InvalidArgument, "etcdserver: request is too large"),
            status(tonic::Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted"),
            etcd_client::Error::InvalidArgs("bad".into()),
        ] {
            let shown = e.to_string();
            let mut once = Some(e);
            let calls = AtomicU32::new(0);
            let (waits, sleep) = recorder();
            let r: Result<(), _> = retry_read_with(&READS, sleep, || {
                calls.fetch_add(1, Ordering::SeqCst);
                std::future::ready(Err(once.take().expect("called once only")))
            })
            .await;
            assert!(r.is_err(), "{shown}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{shown}");
            assert!(waits.lock().unwrap().is_empty(), "{shown}");
        }
    }

    #[tokio::test]
    async fn a_silent_read_is_not_retried() {
        let calls = AtomicU32::new(0);
        let (waits, sleep) = recorder();
        let quick = RetryPolicy { answer_within: Duration::from_millis(50), ..READS };
        let r: Result<(), _> = retry_read_with(&quick, sleep, || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::pending()
        })
        .await;
        assert!(matches!(r, Err(StoreError::Unavailable(ref m)) if m.contains("no answer within 50ms")), "{r:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(waits.lock().unwrap().is_empty());
    }

    #[test]
    fn only_a_failed_connect_proves_a_write_unsent() {
        let unsent = status(tonic::Code::Unavailable, "tcp connect error: Connection refused (os error 111)");
        assert!(never_sent(&unsent));
        for maybe_sent in [
            status(tonic::Code::Unavailable, "error reading a body from connection: connection reset"),
            status(tonic::Code::Unavailable, "etcdserver: leader changed"),
            status(tonic::Code::Unavailable, "etcdserver: request timed out"),
            status(tonic::Code::Unknown, "h2 protocol error: broken pipe"),
            status(tonic::Code::Internal, "tcp connect error"),
            status(tonic::Code::DeadlineExceeded, "tcp connect error"),
        ] {
            assert!(!never_sent(&maybe_sent), "{maybe_sent} may have been sent");
        }
    }

    /// The write loop with a classifier that says "unsent" for the errors
    /// the test marks so (message "unsent"), whatever their code.
    fn marked(e: &etcd_client::Error) -> bool {
        e.to_string().contains("unsent")
    }

    #[tokio::test]
    async fn a_write_is_resent_only_while_it_never_left() {
        // Never sent, every time: 5 tries, the policy's waits.
        let calls = AtomicU32::new(0);
        let (waits, sleep) = recorder();
        let r: Result<(), _> = send_write_with(&WRITES, marked, sleep, || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err(status(tonic::Code::Unavailable, "unsent")))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        let ms: Vec<u128> = waits.lock().unwrap().iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![50, 100, 200, 400]);
        // Unsent once, then maybe sent: the second error goes back at once.
        let calls = AtomicU32::new(0);
        let (waits, sleep) = recorder();
        let r: Result<(), _> = send_write_with(&WRITES, marked, sleep, || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err(status(tonic::Code::Unavailable, if n == 0 { "unsent" } else { "connection reset" })))
        })
        .await;
        assert!(matches!(r, Err(StoreError::Unavailable(ref m)) if m.contains("connection reset")), "{r:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "a write that may have been sent is not resent");
        assert_eq!(waits.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_unanswered_write_is_not_resent() {
        let calls = AtomicU32::new(0);
        let (_, sleep) = recorder();
        let quick = RetryPolicy { answer_within: Duration::from_millis(50), ..WRITES };
        let r: Result<(), _> = send_write_with(
            &quick,
            |_| true,
            sleep,
            || {
                calls.fetch_add(1, Ordering::SeqCst);
                std::future::pending()
            },
        )
        .await;
        assert!(matches!(r, Err(StoreError::Unavailable(ref m)) if m.contains("timed out")), "{r:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
