//! The one signature scheme gnomon speaks, both ways: what the notifier
//! signs its deliveries with, and what a webhook trigger's caller signs
//! its call with. `Gnomon-Timestamp` holds Unix milliseconds and
//! `Gnomon-Signature` holds `sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`.

use gnomon_core::Millis;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header with the call's time, Unix milliseconds.
pub const TIMESTAMP_HEADER: &str = "gnomon-timestamp";
/// The header with the signature.
pub const SIGNATURE_HEADER: &str = "gnomon-signature";

fn mac(secret: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// `sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`.
pub fn signature(secret: &str, timestamp: Millis, body: &[u8]) -> String {
    format!("sha256={}", hex::encode(mac(secret, &timestamp.to_string(), body).finalize().into_bytes()))
}

/// Why a signed call was refused.
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
    #[error("the Gnomon-Signature header is not sha256=<64 hex digits>")]
    BadSignatureFormat,
    #[error("the Gnomon-Signature does not match the body and timestamp under the job's secret")]
    Mismatch,
}

/// A call whose signature held: the signature's bytes name the call (a
/// replay carries the same ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub timestamp: Millis,
    pub signature: [u8; 32],
}

/// Checks a call's timestamp (within `tolerance_ms` of `now`) and its
/// signature over `"<timestamp>.<body>"` under `secret`, in constant time.
pub fn verify(
    secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: Millis,
    tolerance_ms: i64,
) -> Result<Verified, Refusal> {
    let ts_text = timestamp.ok_or(Refusal::NoTimestamp)?.trim();
    let ts: Millis = ts_text.parse().map_err(|_| Refusal::BadTimestamp)?;
    if ts_text.starts_with('+') || ts < 0 {
        return Err(Refusal::BadTimestamp);
    }
    let skew_ms = ts.saturating_sub(now);
    if skew_ms.saturating_abs() > tolerance_ms {
        return Err(Refusal::Stale { skew_ms, tolerance_ms });
    }
    let given = signature.ok_or(Refusal::NoSignature)?.trim();
    let hex_part = given.strip_prefix("sha256=").ok_or(Refusal::BadSignatureFormat)?;
    let mut sig = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut sig).map_err(|_| Refusal::BadSignatureFormat)?;
    mac(secret, ts_text, body).verify_slice(&sig).map_err(|_| Refusal::Mismatch)?;
    Ok(Verified { timestamp: ts, signature: sig })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // HMAC-SHA256("key", "1.{}"), computed independently (Python's hmac).
        let sig = signature("key", 1, b"{}");
        assert_eq!(sig, "sha256=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224");
        assert_ne!(sig, signature("other", 1, b"{}"));
        assert_ne!(sig, signature("key", 2, b"{}"));
    }

    const NOW: Millis = 1_800_000_000_000;

    fn check(ts: Option<&str>, sig: Option<&str>, body: &[u8]) -> Result<Verified, Refusal> {
        verify("s3cret", ts, sig, body, NOW, 300_000)
    }

    #[test]
    fn a_signed_fresh_call_is_verified_and_named_by_its_signature() {
        let sig = signature("s3cret", NOW - 1000, b"{\"a\":1}");
        let v = check(Some(&(NOW - 1000).to_string()), Some(&sig), b"{\"a\":1}").unwrap();
        assert_eq!(v.timestamp, NOW - 1000);
        assert_eq!(hex::encode(v.signature), sig[7..]);
        // Both edges of the window.
        for ts in [NOW - 300_000, NOW + 300_000] {
            assert!(check(Some(&ts.to_string()), Some(&signature("s3cret", ts, b"")), b"").is_ok(), "{ts}");
        }
    }

    #[test]
    fn everything_else_is_refused_with_its_reason() {
        let ts = NOW.to_string();
        let good = signature("s3cret", NOW, b"body");
        assert_eq!(check(None, Some(&good), b"body"), Err(Refusal::NoTimestamp));
        for bad in ["", "soon", "1.5", "+1800000000000", "-5", "99999999999999999999"] {
            assert_eq!(check(Some(bad), Some(&good), b"body"), Err(Refusal::BadTimestamp), "{bad:?}");
        }
        let old = NOW - 300_001;
        assert_eq!(
            check(Some(&old.to_string()), Some(&signature("s3cret", old, b"body")), b"body"),
            Err(Refusal::Stale { skew_ms: -300_001, tolerance_ms: 300_000 })
        );
        assert_eq!(check(Some(&ts), None, b"body"), Err(Refusal::NoSignature));
        for bad in ["", "sha256=", "sha1=00", &good[7..], "sha256=zz", &format!("{good}00")] {
            assert_eq!(check(Some(&ts), Some(bad), b"body"), Err(Refusal::BadSignatureFormat), "{bad:?}");
        }
        assert_eq!(check(Some(&ts), Some(&good), b"bodY"), Err(Refusal::Mismatch), "another body");
        assert_eq!(check(Some(&ts), Some(&signature("other", NOW, b"body")), b"body"), Err(Refusal::Mismatch), "another secret");
        let later = (NOW + 1).to_string();
        assert_eq!(check(Some(&later), Some(&good), b"body"), Err(Refusal::Mismatch), "another timestamp");
    }
}
