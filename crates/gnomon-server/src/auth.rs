//! Bearer-token checks and the safe-listen rule.

use std::net::SocketAddr;

use subtle::ConstantTimeEq;

/// Compares a presented token with the configured one in constant time.
pub fn token_matches(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// A scheduler that runs shell commands is remote code execution for anyone
/// who can reach it: a non-loopback listener needs a token or `--insecure`.
pub fn check_listen(addr: &SocketAddr, token: Option<&str>, insecure: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || insecure || token.is_some_and(|t| !t.is_empty()) {
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {addr}: it is not a loopback address and no bearer token is configured. \
         Set --token (or GNOMON_TOKEN), or pass --insecure if the network is trusted"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_rule() {
        let lo: SocketAddr = "127.0.0.1:7400".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7400".parse().unwrap();
        assert!(check_listen(&lo, None, false).is_ok());
        assert!(check_listen(&any, None, false).is_err());
        assert!(check_listen(&any, Some(""), false).is_err());
        assert!(check_listen(&any, Some("s3cret"), false).is_ok());
        assert!(check_listen(&any, None, true).is_ok());
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abd", "abc"));
        assert!(!token_matches("ab", "abc"));
    }
}
