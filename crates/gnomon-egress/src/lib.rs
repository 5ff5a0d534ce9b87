//! Where HTTP jobs may connect: a worker refuses addresses in its denied
//! ranges — by default the link-local ones, where cloud metadata services
//! answer (169.254.169.254) — whether a job names them directly, through a
//! DNS name, or through a redirect. Connect and total timeouts and a
//! redirect limit bound every request.
//!
//! Proxies: the proxy environment variables (`HTTP_PROXY`, `HTTPS_PROXY`,
//! `ALL_PROXY`, `NO_PROXY`) are ignored, since a proxy resolves names
//! itself and would reach what the worker denies. Only an explicit
//! `--http-proxy URL` is used, and then the worker still resolves and checks
//! every target host (each connection, redirects included) before the
//! request goes to the proxy: a host that does not resolve, or resolves to
//! any denied address, is refused and the proxy never hears of it.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

/// Ranges denied unless the worker is started with `--allow-link-local`.
pub const LINK_LOCAL: [&str; 2] = ["169.254.0.0/16", "fe80::/10"];

/// How long an HTTP job may take to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request's limit when its job sets no timeout.
pub const DEFAULT_TOTAL_TIMEOUT: Duration = Duration::from_secs(300);

/// Redirects followed at most.
pub const MAX_REDIRECTS: usize = 5;

/// The denied ranges, and the proxy requests go through.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    pub denied: Vec<IpNet>,
    /// `--http-proxy`: every request goes through it, its target resolved
    /// and checked here first. `None`: direct (proxy variables ignored).
    pub proxy: Option<reqwest::Url>,
    /// Names answered without the system resolver (tests).
    #[cfg(test)]
    pinned: std::collections::HashMap<String, Vec<IpAddr>>,
}

impl Egress {
    /// The default: link-local denied.
    pub fn with_defaults() -> Self {
        Self { denied: LINK_LOCAL.iter().filter_map(|c| c.parse().ok()).collect(), ..Default::default() }
    }

    /// Parses `--http-proxy`: an `http://` or `https://` URL with a host.
    pub fn parse_proxy(text: &str) -> Result<reqwest::Url, String> {
        let url = reqwest::Url::parse(text.trim()).map_err(|e| format!("--http-proxy {text:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
            return Err(format!("--http-proxy {text:?} must be an http:// or https:// URL with a host, like http://proxy.internal:3128"));
        }
        Ok(url)
    }

    /// The addresses of `host` (system resolver), blocking; on a
    /// multi-threaded runtime the thread is handed over meanwhile.
    fn lookup_blocking(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        #[cfg(test)]
        if let Some(ips) = self.pinned.get(host) {
            return Ok(ips.clone());
        }
        let go = || (host, 0u16).to_socket_addrs().map(|a| a.map(|s| s.ip()).collect());
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(go),
            _ => go(),
        }
    }

    async fn lookup(&self, host: &str) -> std::io::Result<Vec<SocketAddr>> {
        #[cfg(test)]
        if let Some(ips) = self.pinned.get(host) {
            return Ok(ips.iter().map(|ip| SocketAddr::new(*ip, 0)).collect());
        }
        Ok(tokio::net::lookup_host((host, 0)).await?.collect())
    }

    /// Whether a target may go to the proxy: its host is an allowed
    /// literal, or a name that resolves, here, only to allowed addresses.
    fn proxy_allows(&self, url: &reqwest::Url) -> Result<(), String> {
        let ips = match url.host() {
            Some(url::Host::Ipv4(v4)) => vec![IpAddr::V4(v4)],
            Some(url::Host::Ipv6(v6)) => vec![IpAddr::V6(v6)],
            Some(url::Host::Domain(name)) => self.lookup_blocking(name).map_err(|e| format!("{name} does not resolve here: {e}"))?,
            None => return Err("no host".to_string()),
        };
        match ips.iter().find(|ip| self.denies(**ip)) {
            _ if ips.is_empty() => Err("no address".to_string()),
            Some(ip) => Err(format!("it resolves to {ip}, in a range this worker denies")),
            None => Ok(()),
        }
    }

    /// Parses `--deny-cidr` values.
    pub fn parse_cidr(text: &str) -> Result<IpNet, String> {
        text.trim()
            .parse::<IpNet>()
            .or_else(|_| text.trim().parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| format!("--deny-cidr {text:?} is not an address range like 10.0.0.0/8"))
    }

    pub fn denies(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        self.denied.iter().any(|n| n.contains(&ip))
    }

    /// Refuses a URL whose host is a denied address literal.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        let ip = match url.host() {
            Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
            _ => return Ok(()),
        };
        if self.denies(ip) {
            return Err(format!("{ip} is in a range this worker denies (--deny-cidr; link-local unless --allow-link-local)"));
        }
        Ok(())
    }

    /// The HTTP client of a worker: denied ranges enforced at resolution
    /// and on redirects, with the timeouts and redirect limit above.
    pub fn client(&self) -> reqwest::Client {
        let me = Arc::new(self.clone());
        let redirects = me.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match redirects.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(format!("redirect refused: {e}")),
            }
        });
        // Never the proxy environment variables.
        let mut builder = reqwest::Client::builder().no_proxy();
        if let Some(proxy) = me.proxy.clone() {
            let check = me.clone();
            // A target refused here is not proxied: it goes to the direct
            // path, whose resolver refuses every target when a proxy is set.
            builder = builder.proxy(reqwest::Proxy::custom(move |url| match check.proxy_allows(url) {
                Ok(()) => Some(proxy.clone()),
                Err(e) => {
                    tracing::debug!(url = %url, "not sent to the proxy: {e}");
                    None
                }
            }));
        }
        builder.connect_timeout(CONNECT_TIMEOUT).redirect(policy).dns_resolver(Arc::new(Resolver(me))).build().unwrap_or_default()
    }
}

/// Resolves names with the system resolver, then drops denied addresses.
struct Resolver(Arc<Egress>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            if let Some(proxy) = &egress.proxy {
                // With a proxy, only the proxy itself is dialled directly:
                // any other name here is a target the proxy check refused.
                if proxy.host_str() != Some(host.as_str()) {
                    let why = match egress.lookup(&host).await {
                        Err(e) => {
                            format!("{host} does not resolve on this worker ({e}), which resolves every target itself before --http-proxy")
                        }
                        Ok(a) if a.iter().any(|a| egress.denies(a.ip())) => {
                            format!("{host} resolves to addresses this worker denies (--deny-cidr)")
                        }
                        Ok(_) => format!("{host} was refused by this worker's check before --http-proxy"),
                    };
                    return Err(Box::<dyn std::error::Error + Send + Sync>::from(why));
                }
            }
            let addrs: Vec<SocketAddr> = egress.lookup(&host).await?;
            let allowed: Vec<SocketAddr> = addrs.iter().copied().filter(|a| !egress.denies(a.ip())).collect();
            if allowed.is_empty() && !addrs.is_empty() {
                let msg = format!("{host} resolves only to addresses this worker denies (--deny-cidr)");
                return Err(Box::<dyn std::error::Error + Send + Sync>::from(msg));
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_is_denied_by_default() {
        let e = Egress::with_defaults();
        assert!(e.denies("169.254.169.254".parse().unwrap()));
        assert!(e.denies("::ffff:169.254.169.254".parse().unwrap()));
        assert!(e.denies("fe80::1".parse().unwrap()));
        assert!(!e.denies("127.0.0.1".parse().unwrap()));
        assert!(e.check_url(&"http://169.254.169.254/latest/meta-data".parse().unwrap()).is_err());
        assert!(Egress::default().check_url(&"http://169.254.169.254/".parse().unwrap()).is_ok());
        assert!(Egress::parse_cidr("10.0.0.0/8").is_ok() && Egress::parse_cidr("10.1.2.3").is_ok());
        assert!(Egress::parse_cidr("ten").is_err());
    }

    /// A GET through this egress, as an HTTP job makes it: the URL checked
    /// first, then the request through the egress's client. The body, or
    /// the error with its causes.
    async fn run_http(url: String, egress: Egress) -> Result<String, String> {
        fn chain(e: &dyn std::error::Error) -> String {
            let mut s = e.to_string();
            let mut src = e.source();
            while let Some(x) = src {
                s.push_str(&format!(": {x}"));
                src = x.source();
            }
            s
        }
        let parsed: reqwest::Url = url.parse().map_err(|e| format!("{e}"))?;
        egress.check_url(&parsed).map_err(|e| format!("request refused: {e}"))?;
        let r = egress.client().get(&url).send().await.map_err(|e| chain(&e))?;
        r.text().await.map_err(|e| chain(&e))
    }

    #[tokio::test]
    async fn denied_addresses_are_refused_directly_by_name_and_by_redirect() {
        use axum::response::Redirect;
        use axum::{routing::get, Router};
        let app = Router::new()
            .route("/ok", get(|| async { "fine" }))
            .route("/metadata", get(|| async { Redirect::temporary("http://169.254.169.254/latest/meta-data") }))
            .route("/loop", get(|| async { Redirect::temporary("/loop") }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let e = Egress::with_defaults();
        assert_eq!(run_http(format!("http://{addr}/ok"), e.clone()).await.as_deref(), Ok("fine"));
        let out = run_http("http://169.254.169.254/latest/meta-data".into(), e.clone()).await.unwrap_err();
        assert!(out.contains("request refused"), "{out}");
        let out = run_http(format!("http://{addr}/metadata"), e.clone()).await.unwrap_err();
        assert!(out.contains("redirect refused"), "{out}");
        let out = run_http(format!("http://{addr}/loop"), e.clone()).await.unwrap_err();
        assert!(out.contains("redirects"), "{out}");
        // A name that resolves only to denied addresses.
        let no_loopback = Egress { denied: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()], ..Default::default() };
        let out = run_http(format!("http://localhost:{}/ok", addr.port()), no_loopback).await.unwrap_err();
        assert!(out.contains("denies"), "{out}");
    }

    /// A proxy on loopback that records each request's first line and
    /// answers 200, or a redirect to a link-local name for `/hop`.
    async fn recording_proxy() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let line = text.lines().next().unwrap_or("").to_string();
                    log.lock().unwrap().push(line.clone());
                    let answer = if line.contains("/hop") {
                        "HTTP/1.1 302 Found\r\nLocation: http://metadata.test/latest\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    } else {
                        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    };
                    let _ = s.write_all(answer.as_bytes()).await;
                });
            }
        });
        (addr, seen)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_a_proxy_targets_are_resolved_and_checked_by_the_worker_first() {
        let (proxy, seen) = recording_proxy().await;
        let mut e = Egress::with_defaults();
        e.proxy = Some(Egress::parse_proxy(&format!("http://{proxy}")).unwrap());
        let pin = |e: &mut Egress, name: &str, ips: &[&str]| {
            e.pinned.insert(name.to_string(), ips.iter().map(|i| i.parse().unwrap()).collect());
        };
        pin(&mut e, "metadata.test", &["169.254.169.254"]);
        pin(&mut e, "mixed.test", &["127.0.0.1", "169.254.169.254"]);
        pin(&mut e, "v6.test", &["fe80::1"]);
        pin(&mut e, "app.test", &["127.0.0.1"]);
        // An allowed name goes through the proxy.
        let out = run_http("http://app.test/x".into(), e.clone()).await;
        assert_eq!(out.as_deref(), Ok("ok"));
        assert_eq!(*seen.lock().unwrap(), vec!["GET http://app.test/x HTTP/1.1".to_string()]);
        // Names that resolve to a denied address never reach it, over
        // http or https (CONNECT), nor does a redirect to one.
        for url in ["http://metadata.test/latest/meta-data", "http://mixed.test/", "http://v6.test/", "https://metadata.test/"] {
            let out = run_http(url.into(), e.clone()).await.unwrap_err();
            assert!(out.contains("denies"), "{url}: {out}");
        }
        assert_eq!(seen.lock().unwrap().len(), 1, "{:?}", seen.lock().unwrap());
        let out = run_http("http://app.test/hop".into(), e.clone()).await;
        assert!(out.is_err(), "{out:?}");
        assert_eq!(seen.lock().unwrap().len(), 2, "only the first hop reached the proxy: {:?}", seen.lock().unwrap());
        // Without --http-proxy the proxy variables are ignored: a name that
        // does not resolve fails here instead of going to the proxy.
        let direct = Egress::with_defaults();
        // The variable is read when a client is built; no other test here sets it.
        std::env::set_var("HTTP_PROXY", format!("http://{proxy}"));
        let client = direct.client();
        std::env::remove_var("HTTP_PROXY");
        let req_url = "http://metadata.google.internal/computeMetadata/v1/";
        let r = client.get(req_url).send().await;
        assert!(r.is_err(), "{r:?}");
        assert_eq!(seen.lock().unwrap().len(), 2, "{:?}", seen.lock().unwrap());
        assert!(Egress::parse_proxy("socks5://p:1080").is_err() && Egress::parse_proxy("nonsense").is_err());
    }
}
