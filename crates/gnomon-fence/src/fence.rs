//! An attempt's fence: read from where gnomon passes it (HTTP headers,
//! the environment), checked, and compared with the run's newest started
//! attempt.

use crate::{Fence, FenceError, FenceParseError};

/// The fence of the attempt that sent an HTTP request (the
/// `Gnomon-Run-Id`, `Gnomon-Attempt` and `Gnomon-Fence-Token` headers
/// gnomon's HTTP jobs carry), for a receiving service.
pub fn fence_from_headers(headers: &http::HeaderMap) -> Result<Fence, FenceError> {
    Ok(Fence::read(["gnomon-run-id", "gnomon-attempt", "gnomon-fence-token"], |k| {
        headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_string)
    })?)
}

/// The fence of a shell job's attempt (`GNOMON_RUN_ID`, `GNOMON_ATTEMPT`,
/// `GNOMON_FENCE_TOKEN`).
pub fn fence_from_env() -> Result<Fence, FenceError> {
    Ok(Fence::from_env()?)
}

/// Whether what the run's row holds is newer than `fence`: a higher
/// attempt, or the same attempt and a higher token.
pub(crate) fn newer(fence: &Fence, seen_attempt: i64, seen_token: i64) -> bool {
    (seen_attempt, seen_token) > (i64::from(fence.attempt), token(fence))
}

pub(crate) fn token(fence: &Fence) -> i64 {
    i64::try_from(fence.token).unwrap_or(i64::MAX)
}

pub(crate) fn superseded(fence: &Fence, seen_attempt: i64, seen_token: i64) -> FenceError {
    FenceError::Superseded {
        run_id: fence.run_id.clone(),
        mine_attempt: fence.attempt,
        mine_token: fence.token,
        seen_attempt: u32::try_from(seen_attempt).unwrap_or(u32::MAX),
        seen_token: u64::try_from(seen_token).unwrap_or(0),
    }
}

pub(crate) fn check_fence(fence: &Fence) -> Result<(), FenceError> {
    if fence.run_id.is_empty() || fence.run_id.len() > 255 {
        return Err(FenceParseError::Invalid(format!("run id {:?}", fence.run_id)).into());
    }
    if fence.attempt == 0 {
        return Err(FenceParseError::Invalid("attempt 0".to_string()).into());
    }
    Ok(())
}
