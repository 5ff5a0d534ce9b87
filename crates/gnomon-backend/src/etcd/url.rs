//! The `etcd://` store URL.

use crate::StoreError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    pub target: crate::etcd::EtcdTarget,
    pub cluster: String,
}

/// Parses `etcd://[user:pass@]h1:2379,h2:2379[/cluster][?ca=PATH[&cert=PATH&key=PATH]]`;
/// `ca=` turns TLS on (`https://` to every member).
pub fn parse_url(url: &str) -> Result<EtcdUrl, StoreError> {
    let rest = url.strip_prefix("etcd://").ok_or_else(|| {
        let shown = url.rsplit_once('@').map_or(url.to_string(), |(_, host)| format!("…@{host}"));
        StoreError::InvalidUrl(format!("{shown:?} does not start with etcd://"))
    })?;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((a, r)) => (Some(a), r),
        None => (None, rest),
    };
    let (hosts, cluster) = match rest.split_once('/') {
        Some((h, c)) => (h, c.trim_end_matches('/')),
        None => (rest, ""),
    };
    let cluster = if cluster.is_empty() { "default" } else { cluster };
    if !crate::etcd::valid_cluster_name(cluster) {
        return Err(StoreError::InvalidUrl(format!("etcd cluster name {cluster:?} must be letters, digits, '-', '_' or '.'")));
    }
    let endpoints = crate::etcd::parse_endpoints(hosts).map_err(StoreError::InvalidUrl)?;
    let user = match auth {
        None => None,
        Some(a) => {
            let (u, p) = a.split_once(':').ok_or_else(|| StoreError::InvalidUrl("etcd credentials must be user:password@".into()))?;
            Some((u.to_string(), p.to_string()))
        }
    };
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) =
            pair.split_once('=').ok_or_else(|| StoreError::InvalidUrl(format!("etcd URL parameter {pair:?} must be key=value")))?;
        let slot = match k {
            "ca" => &mut ca,
            "cert" => &mut cert,
            "key" => &mut key,
            _ => return Err(StoreError::InvalidUrl(format!("unknown etcd URL parameter {k:?} (ca, cert, key)"))),
        };
        *slot = Some(std::path::PathBuf::from(v));
    }
    let tls = match (ca, cert, key) {
        (None, None, None) => None,
        (Some(ca), cert, key) if cert.is_some() == key.is_some() => Some(crate::etcd::EtcdTls { ca, cert, key }),
        (None, _, _) => return Err(StoreError::InvalidUrl("etcd TLS needs ca= (the CA that signed the members' certificates)".into())),
        _ => return Err(StoreError::InvalidUrl("etcd TLS: cert= and key= go together".into())),
    };
    Ok(EtcdUrl { target: crate::etcd::EtcdTarget { endpoints, user, tls }, cluster: cluster.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_why() {
        let u = parse_url("etcd://127.0.0.1:2379,127.0.0.1:2380/prod").unwrap();
        assert_eq!(u.target.endpoints, vec!["http://127.0.0.1:2379", "http://127.0.0.1:2380"]);
        assert_eq!(u.cluster, "prod");
        assert_eq!(parse_url("etcd://h:1").unwrap().cluster, "default");
        assert_eq!(parse_url("etcd://me:pw@h:1").unwrap().target.user, Some(("me".into(), "pw".into())));
        let tls = parse_url("etcd://h:1/c?ca=/x/ca.pem&cert=/x/c.pem&key=/x/k.pem").unwrap().target;
        assert_eq!(tls.urls(), vec!["https://h:1"]);
        assert_eq!(tls.tls.unwrap().key.unwrap(), std::path::PathBuf::from("/x/k.pem"));
        for bad in [
            "etcd://",
            "etcd://h",
            "etcd://h:1/a b",
            "etcd://me@h:1",
            "mysql://h:1",
            "etcd://h:1?cert=/c",
            "etcd://h:1?ca=/a&cert=/c",
            "etcd://h:1?x=1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
    }
}
