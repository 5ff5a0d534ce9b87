//! Where HTTP jobs may connect: a worker refuses addresses in its denied
//! ranges — by default the link-local ones, where cloud metadata services
//! answer (169.254.169.254) — whether a job names them directly, through a
//! DNS name, or through a redirect. Connect and total timeouts and a
//! redirect limit bound every request.

use std::net::{IpAddr, SocketAddr};
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

/// The denied ranges.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    pub denied: Vec<IpNet>,
}

impl Egress {
    /// The default: link-local denied.
    pub fn with_defaults() -> Self {
        Self { denied: LINK_LOCAL.iter().filter_map(|c| c.parse().ok()).collect() }
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
        reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(policy)
            .dns_resolver(Arc::new(Resolver(me)))
            .build()
            .unwrap_or_default()
    }
}

/// Resolves names with the system resolver, then drops denied addresses.
struct Resolver(Arc<Egress>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
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

    async fn run_http(url: String, egress: Egress) -> crate::ExecOutcome {
        let req = crate::ExecRequest {
            run_id: "r-1".into(),
            attempt: 1,
            job: "j".into(),
            namespace: "default".into(),
            scheduled_at: 0,
            token: 1,
            worker_id: "w".into(),
            executor: gnomon_core::spec::Executor::Http(gnomon_core::spec::HttpSpec {
                method: "GET".into(),
                url,
                headers: Default::default(),
                body: None,
                expect_status: None,
            }),
            timeout: Some(Duration::from_secs(20)),
            isolation: Arc::default(),
            egress: Arc::new(egress.clone()),
        };
        crate::execute(&req, &egress.client(), &crate::HandlerRegistry::default(), tokio::sync::watch::channel(false).1).await
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
        assert_eq!(run_http(format!("http://{addr}/ok"), e.clone()).await.state, gnomon_core::AttemptState::Succeeded);
        let out = run_http("http://169.254.169.254/latest/meta-data".into(), e.clone()).await;
        assert!(out.output.contains("request refused"), "{}", out.output);
        let out = run_http(format!("http://{addr}/metadata"), e.clone()).await;
        assert!(out.output.contains("redirect refused"), "{}", out.output);
        let out = run_http(format!("http://{addr}/loop"), e.clone()).await;
        assert!(out.output.contains("redirects"), "{}", out.output);
        // A name that resolves only to denied addresses.
        let no_loopback = Egress { denied: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()] };
        let out = run_http(format!("http://localhost:{}/ok", addr.port()), no_loopback).await;
        assert_eq!(out.state, gnomon_core::AttemptState::Failed);
        assert!(out.output.contains("denies"), "{}", out.output);
    }
}
