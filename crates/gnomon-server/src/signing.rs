//! The one signature scheme gnomon speaks, both ways: what the notifier
//! signs its deliveries with, and what a webhook trigger's caller signs
//! its call with.
//!
//! `Gnomon-Timestamp` holds Unix milliseconds and `Gnomon-Signature` holds
//! `v2=<hex HMAC-SHA256>` of the signed string
//! `v2\n{namespace}\n{job}\n{timestamp}\n{key}\n{body}`: the place (a call
//! signed for one job is no call of another), the time, the idempotency key
//! (empty without one) and the body. The first form, `sha256=<hex HMAC of
//! "<timestamp>.<body>">`, covers neither place nor key: it is accepted
//! until [`V1_CUTOVER_MS`], and never with a key.

use gnomon_core::Millis;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header with the call's time, Unix milliseconds.
pub const TIMESTAMP_HEADER: &str = "gnomon-timestamp";
/// The header with the signature.
pub const SIGNATURE_HEADER: &str = "gnomon-signature";

/// After this instant (2027-03-01T00:00:00Z) a first-form (`sha256=`)
/// signature is refused like any bad one.
pub const V1_CUTOVER_MS: Millis = 1_803_859_200_000;

/// Where and what a signature covers.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub namespace: &'a str,
    pub job: &'a str,
    /// The `Idempotency-Key`, empty without one.
    pub key: &'a str,
    pub body: &'a [u8],
}

fn hmac(secret: &str) -> Hmac<Sha256> {
    <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length")
}

fn mac_v2(secret: &str, timestamp: &str, s: &Signed) -> Hmac<Sha256> {
    let mut mac = hmac(secret);
    for part in [b"v2".as_slice(), s.namespace.as_bytes(), s.job.as_bytes(), timestamp.as_bytes(), s.key.as_bytes()] {
        mac.update(part);
        mac.update(b"\n");
    }
    mac.update(s.body);
    mac
}

fn mac_v1(secret: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = hmac(secret);
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// `v2=<hex HMAC-SHA256 of "v2\n{namespace}\n{job}\n{timestamp}\n{key}\n{body}">`.
pub fn signature(secret: &str, timestamp: Millis, signed: &Signed) -> String {
    format!("v2={}", hex::encode(mac_v2(secret, &timestamp.to_string(), signed).finalize().into_bytes()))
}

/// The first form, `sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`,
/// for senders not yet moved (and the tests of its cutover).
pub fn signature_v1(secret: &str, timestamp: Millis, body: &[u8]) -> String {
    format!("sha256={}", hex::encode(mac_v1(secret, &timestamp.to_string(), body).finalize().into_bytes()))
}

/// Why a signed call was refused (for the server's log; a caller is told
/// only that it was not authorized).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the Gnomon-Timestamp header is missing")]
    NoTimestamp,
    #[error("the Gnomon-Timestamp header is not a time in Unix milliseconds")]
    BadTimestamp,
    #[error("the Gnomon-Timestamp is {skew_ms} ms from this server's clock, past the {tolerance_ms} ms the job accepts")]
    Stale { skew_ms: i64, tolerance_ms: i64 },
    #[error("the Gnomon-Signature header is missing")]
    NoSignature,
    #[error("the Gnomon-Signature header is not v2=<64 hex digits>")]
    BadSignatureFormat,
    #[error("a sha256= signature (the first form) is refused after the cutover, or with an Idempotency-Key")]
    V1Refused,
    #[error("the Gnomon-Signature does not match the call under any of the job's secrets")]
    Mismatch,
}

/// A call whose signature held: the signature's bytes name the call (a
/// replay carries the same ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub timestamp: Millis,
    pub signature: [u8; 32],
}

/// Checks a timestamp header: Unix milliseconds within `tolerance_ms` of
/// `now`. Cheap, so a server checks it before it reads a body.
pub fn check_timestamp(timestamp: Option<&str>, now: Millis, tolerance_ms: i64) -> Result<Millis, Refusal> {
    let ts_text = timestamp.ok_or(Refusal::NoTimestamp)?.trim();
    let ts: Millis = ts_text.parse().map_err(|_| Refusal::BadTimestamp)?;
    if ts_text.starts_with('+') || ts_text.starts_with('0') && ts_text.len() > 1 || ts < 0 {
        return Err(Refusal::BadTimestamp);
    }
    let skew_ms = ts.saturating_sub(now);
    if skew_ms.saturating_abs() > tolerance_ms {
        return Err(Refusal::Stale { skew_ms, tolerance_ms });
    }
    Ok(ts)
}

/// Checks a call's timestamp (within `tolerance_ms` of `now`) and its
/// signature under any of `secrets`, in constant time per secret.
pub fn verify(
    secrets: &[String],
    timestamp: Option<&str>,
    signature: Option<&str>,
    signed: &Signed,
    now: Millis,
    tolerance_ms: i64,
) -> Result<Verified, Refusal> {
    let ts = check_timestamp(timestamp, now, tolerance_ms)?;
    let ts_text = ts.to_string();
    let given = signature.ok_or(Refusal::NoSignature)?.trim();
    let (v1, hex_part) = match (given.strip_prefix("v2="), given.strip_prefix("sha256=")) {
        (Some(h), _) => (false, h),
        (None, Some(h)) => (true, h),
        (None, None) => return Err(Refusal::BadSignatureFormat),
    };
    let mut sig = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut sig).map_err(|_| Refusal::BadSignatureFormat)?;
    if v1 && (now >= V1_CUTOVER_MS || !signed.key.is_empty()) {
        return Err(Refusal::V1Refused);
    }
    let mut held = false;
    for secret in secrets {
        let mac = if v1 { mac_v1(secret, &ts_text, signed.body) } else { mac_v2(secret, &ts_text, signed) };
        held |= mac.verify_slice(&sig).is_ok();
    }
    if !held {
        return Err(Refusal::Mismatch);
    }
    Ok(Verified { timestamp: ts, signature: sig })
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: Signed = Signed { namespace: "team-a", job: "deploy", key: "", body: b"{}" };

    #[test]
    fn the_signature_is_hmac_sha256_of_the_v2_string() {
        // HMAC-SHA256("key", "v2\nteam-a\ndeploy\n1\n\n{}") and the first
        // form's HMAC-SHA256("key", "1.{}"), computed independently
        // (Python's hmac).
        assert_eq!(signature("key", 1, &AT), "v2=b651cdf1351d7bff6e689833b3a9c8663a4783a32c591dc2f2a3ee9c7b5782d5");
        assert_eq!(signature_v1("key", 1, b"{}"), "sha256=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224");
    }

    const NOW: Millis = 1_800_000_000_000;

    fn check(ts: Option<&str>, sig: Option<&str>, signed: &Signed) -> Result<Verified, Refusal> {
        verify(&["s3cret".to_string()], ts, sig, signed, NOW, 300_000)
    }

    #[test]
    fn a_signed_fresh_call_is_verified_and_named_by_its_signature() {
        let call = Signed { body: b"{\"a\":1}", ..AT };
        let sig = signature("s3cret", NOW - 1000, &call);
        let v = check(Some(&(NOW - 1000).to_string()), Some(&sig), &call).unwrap();
        assert_eq!(v.timestamp, NOW - 1000);
        assert_eq!(hex::encode(v.signature), sig[3..]);
        // Both edges of the window.
        for ts in [NOW - 300_000, NOW + 300_000] {
            assert!(check(Some(&ts.to_string()), Some(&signature("s3cret", ts, &AT)), &AT).is_ok(), "{ts}");
        }
        // Either of two secrets.
        let two = ["old".to_string(), "new".to_string()];
        for s in &two {
            assert!(verify(&two, Some(&NOW.to_string()), Some(&signature(s, NOW, &AT)), &AT, NOW, 1000).is_ok());
        }
    }

    #[test]
    fn a_signature_holds_only_for_its_place_key_time_and_body() {
        let ts = NOW.to_string();
        let good = signature("s3cret", NOW, &AT);
        assert!(check(Some(&ts), Some(&good), &AT).is_ok());
        for other in [
            Signed { namespace: "team-b", ..AT },
            Signed { job: "deploy2", ..AT },
            Signed { key: "k", ..AT },
            Signed { body: b"{ }", ..AT },
            // The parts cannot slide into each other.
            Signed { namespace: "team-a\ndeploy", job: "", ..AT },
        ] {
            assert_eq!(check(Some(&ts), Some(&good), &other), Err(Refusal::Mismatch), "{other:?}");
        }
        assert_eq!(check(Some(&(NOW + 1).to_string()), Some(&good), &AT), Err(Refusal::Mismatch), "another timestamp");
        assert_eq!(check(Some(&ts), Some(&signature("other", NOW, &AT)), &AT), Err(Refusal::Mismatch), "another secret");
    }

    #[test]
    fn the_first_form_holds_only_before_the_cutover_and_without_a_key() {
        let v1 = signature_v1("s3cret", NOW, AT.body);
        const { assert!(NOW < V1_CUTOVER_MS) };
        assert!(check(Some(&NOW.to_string()), Some(&v1), &AT).is_ok());
        assert_eq!(check(Some(&NOW.to_string()), Some(&v1), &Signed { key: "k", ..AT }), Err(Refusal::V1Refused));
        let after = V1_CUTOVER_MS + 1;
        let late = signature_v1("s3cret", after, AT.body);
        assert_eq!(verify(&["s3cret".into()], Some(&after.to_string()), Some(&late), &AT, after, 1000), Err(Refusal::V1Refused));
        let v2 = signature("s3cret", after, &AT);
        assert!(verify(&["s3cret".into()], Some(&after.to_string()), Some(&v2), &AT, after, 1000).is_ok());
    }

    #[test]
    fn everything_else_is_refused_with_its_reason() {
        let ts = NOW.to_string();
        let good = signature("s3cret", NOW, &AT);
        assert_eq!(check(None, Some(&good), &AT), Err(Refusal::NoTimestamp));
        for bad in ["", "soon", "1.5", "+1800000000000", "-5", "99999999999999999999", "01800000000000"] {
            assert_eq!(check(Some(bad), Some(&good), &AT), Err(Refusal::BadTimestamp), "{bad:?}");
        }
        let old = NOW - 300_001;
        assert_eq!(
            check(Some(&old.to_string()), Some(&signature("s3cret", old, &AT)), &AT),
            Err(Refusal::Stale { skew_ms: -300_001, tolerance_ms: 300_000 })
        );
        assert_eq!(check(Some(&ts), None, &AT), Err(Refusal::NoSignature));
        for bad in ["", "v2=", "sha1=00", &good[3..], "v2=zz", &format!("{good}00")] {
            assert_eq!(check(Some(&ts), Some(bad), &AT), Err(Refusal::BadSignatureFormat), "{bad:?}");
        }
        assert!(verify(&[], Some(&ts), Some(&good), &AT, NOW, 1000).is_err(), "no secret held, nothing holds");
    }
}
