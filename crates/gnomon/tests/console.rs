//! The web console in a real browser: headless Chromium driven through
//! chromedriver (WebDriver) against a real `gnomon dev` with a token. It
//! signs in (a wrong token first), creates a job in the form (a bad cron
//! first, whose error shows under its field), sees it fire, opens a run and
//! its output, pauses and resumes the job, and cancels a running run.
//! Screenshots of each page land in `target/tmp/console/`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

const TOKEN: &str = "console-test-token-0123456789";

fn chromedriver() -> String {
    for c in ["chromedriver", "/usr/lib/chromium/chromedriver"] {
        if Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success()) {
            return c.to_string();
        }
    }
    panic!("this test drives Chromium through chromedriver: install the chromium and chromium-driver packages (scripts/test.sh does)");
}

fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("which").arg(c).output() {
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !path.is_empty() {
                return path;
            }
        }
    }
    panic!("this test drives a headless Chromium: install the chromium package (scripts/test.sh does)");
}

/// A child process ended when the test ends.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Browser {
    c: Client,
    base: String,
    shots: PathBuf,
}

impl Browser {
    async fn goto(&self, fragment: &str) {
        self.c.goto(&format!("{}/{fragment}", self.base)).await.unwrap();
    }

    /// The first element matching `css` whose text contains `text`, waiting up to `secs`.
    async fn wait_text(&self, css: &str, text: &str, secs: u64) -> fantoccini::elements::Element {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Ok(found) = self.c.find_all(Locator::Css(css)).await {
                for e in found {
                    if e.text().await.is_ok_and(|t| t.contains(text)) {
                        return e;
                    }
                }
            }
            if Instant::now() > deadline {
                self.shot("timeout").await;
                let body = self.c.source().await.unwrap_or_default();
                panic!("no {css} with text {text:?} within {secs}s; page:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn el(&self, css: &str) -> fantoccini::elements::Element {
        self.wait_text(css, "", 30).await
    }

    async fn fill(&self, css: &str, value: &str) {
        let e = self.el(css).await;
        e.clear().await.unwrap();
        e.send_keys(value).await.unwrap();
    }

    async fn shot(&self, name: &str) {
        if let Ok(png) = self.c.screenshot().await {
            let _ = std::fs::write(self.shots.join(format!("{name}.png")), png);
        }
    }
}

fn api(addr: &str, method: &str, path: &str, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
    let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
    http_as(Some(TOKEN), addr, method, path, bytes.as_deref()).unwrap()
}

fn start(dir: &Path, auth_file: &Path) -> (Proc, String, Owned, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let dev = Proc::spawn_env(
        dir,
        "dev",
        &[
            "--token".into(),
            TOKEN.into(),
            "dev".into(),
            "--auth-file".into(),
            auth_file.display().to_string(),
            "--listen".into(),
            addr.clone(),
            "--data-dir".into(),
            dir.join("data").display().to_string(),
        ],
        &[("GNOMON_HOOK_SECRET_CONSOLE".into(), "console-secret".into()), ("GNOMON_QUOTA".into(), "team-q:open_runs=1234".into())],
    );
    wait_until("the server to lead", Duration::from_secs(60), || {
        http(&addr, "GET", "/readyz", None).map(|(s, v)| s == 200 && v["leading"] == json!(true)).unwrap_or(false)
    });
    let driver_port = free_port();
    let log = std::fs::File::create(dir.join("chromedriver.log")).unwrap();
    let driver = Owned(
        Command::new(chromedriver())
            .arg(format!("--port={driver_port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting chromedriver"),
    );
    let driver_url = format!("http://127.0.0.1:{driver_port}");
    wait_until("chromedriver to listen", Duration::from_secs(30), || std::net::TcpStream::connect(("127.0.0.1", driver_port)).is_ok());
    (dev, addr, driver, driver_url)
}

/// A Chromium session through chromedriver, and the browser's view of the
/// console at `addr` (screenshots in `target/tmp/console/`).
async fn browser(dir: &Path, driver_url: &str, addr: &str) -> (Client, Browser) {
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&shots).unwrap();
    let caps = serde_json::from_value(json!({
        "goog:chromeOptions": {
            "binary": chromium(),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000",
                     format!("--user-data-dir={}", dir.join("profile").display())]
        }
    }))
    .unwrap();
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let c = ClientBuilder::new(connector).capabilities(caps).connect(driver_url).await.expect("a chromedriver session");
    (c.clone(), Browser { c, base: format!("http://{addr}"), shots })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_does_what_the_cli_does() {
    let dir = tempfile::tempdir().unwrap();
    let (viewer, entry) = new_credential("viewer-1", &["--role", "viewer"]);
    let auth_file = dir.path().join("auth.toml");
    std::fs::write(&auth_file, entry).unwrap();
    let (dev, addr, _driver, driver_url) = start(dir.path(), &auth_file);
    // The server asks for the token.
    assert_eq!(http(&addr, "GET", "/v1/jobs", None).unwrap().0, 401, "{}", dev.log());
    let (c, b) = browser(dir.path(), &driver_url, &addr).await;
    // The walk runs as its own task so that a failure still ends the
    // browser session (and the browser with it) before the test fails.
    let walked = tokio::spawn({
        let addr = addr.clone();
        async move {
            walk(&b, &addr, &viewer).await;
            // The server goes away: the page says so, and keeps trying.
            dev.signal(SIGKILL);
            b.wait_text("#banner", "unreachable", 60).await;
            b.shot("13-unreachable").await;
            dev
        }
    })
    .await;
    let _ = c.close().await;
    if let Err(e) = walked {
        eprintln!("server log:\n{}", std::fs::read_to_string(dir.path().join("dev.log")).unwrap_or_default());
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn walk(b: &Browser, addr: &str, viewer: &str) {
    // Sign in: the dialog opens; a wrong token is refused, the right one is kept.
    b.goto("").await;
    b.wait_text("#signin-why", "", 30).await;
    b.fill("#signin-token", "not-the-token").await;
    b.el("#signin-go").await.click().await.unwrap();
    b.wait_text("#signin-err", "", 30).await;
    b.shot("01-sign-in").await;
    b.fill("#signin-token", TOKEN).await;
    b.el("#signin-go").await.click().await.unwrap();
    b.wait_text("#who", "admin", 30).await;
    b.wait_text("#card-leader", "dev", 30).await;

    // A job with a bad cron: the API's error shows under the cron field.
    b.goto("#/jobs/new").await;
    b.fill("#f-name", "console-echo").await;
    b.fill("#f-cron", "61 * * * * *").await;
    b.fill("#f-command", "sh").await;
    b.fill("#f-args", "-c\necho hello from the console").await;
    b.wait_text("#preview .err", "", 30).await;
    b.el("#save").await.click().await.unwrap();
    let err = b.wait_text("[data-err='schedule.cron']", "invalid_cron", 30).await;
    assert!(err.text().await.unwrap().contains("61"), "the error names the bad field");
    b.shot("02-form-bad-cron").await;
    assert_eq!(api(addr, "GET", "/v1/jobs/console-echo", None).0, 404, "a refused job is not created");

    // Fixed: the preview lists ten times, and the job is created.
    b.fill("#f-cron", "*/2 * * * * *").await;
    b.wait_text("#preview li:nth-child(10)", ":", 30).await;
    b.shot("03-form-preview").await;
    b.el("#save").await.click().await.unwrap();
    b.wait_text("h1", "default/console-echo", 30).await;

    // It fires on its own; its run and the run's output are shown.
    b.wait_text(".st.succeeded", "succeeded", 60).await;
    b.shot("04-job").await;
    let run = b.wait_text("tr", "succeeded", 60).await;
    run.find(Locator::Css("a[href^='#/run/']")).await.unwrap().click().await.unwrap();
    b.wait_text("pre.output", "hello from the console", 30).await;
    b.wait_text(".tbl", "dev-worker", 30).await;
    b.shot("05-run").await;

    // Pause and resume from the job's page.
    b.goto("#/job/default/console-echo").await;
    b.wait_text("button[data-act='pause']", "Pause", 30).await.click().await.unwrap();
    b.wait_text("h1 .st", "paused", 30).await;
    assert_eq!(api(addr, "GET", "/v1/jobs/console-echo", None).1["status"]["paused"], json!(true));
    b.wait_text("button[data-act='resume']", "Resume", 30).await.click().await.unwrap();
    b.wait_text("button[data-act='pause']", "Pause", 30).await;
    assert_eq!(api(addr, "GET", "/v1/jobs/console-echo", None).1["status"]["paused"], json!(false));

    // Cancel a running run.
    let slow = json!({"name": "console-slow", "executor": {"shell": {"command": "sleep", "args": ["120"]}}});
    assert_eq!(api(addr, "POST", "/v1/jobs", Some(slow)).0, 201);
    let next = json!({"name": "console-next", "after": [{"job": "console-slow"}], "executor": {"handler": {"name": "noop"}}});
    assert_eq!(api(addr, "POST", "/v1/jobs", Some(next)).0, 201);
    let (status, run) = api(addr, "POST", "/v1/jobs/console-slow/trigger", None);
    assert_eq!(status, 201);
    let id = run["id"].as_str().unwrap().to_string();
    b.goto(&format!("#/run/{id}")).await;
    b.wait_text(".st.running", "running", 60).await;
    // Its page shows the graph of its instant: the run waiting after it.
    b.wait_text("#graph", "console-next", 30).await;
    b.wait_text("#graph .node[data-job='console-next'][data-state='waiting']", "waiting", 30).await;
    b.el("#cancel").await.click().await.unwrap();
    b.el("#confirm-yes").await.click().await.unwrap();
    b.wait_text(".card .st", "cancelled", 60).await;
    b.shot("06-run-cancelled").await;
    assert_eq!(api(addr, "GET", &format!("/v1/runs/{id}"), None).1["state"], json!("cancelled"));

    // A backfill shows on its job's page with its progress, and is
    // cancelled there.
    let tick = json!({"name": "console-tick", "schedule": {"every": "1s"}, "executor": {"handler": {"name": "noop"}}});
    assert_eq!(api(addr, "POST", "/v1/jobs", Some(tick)).0, 201);
    let at = |ago_s: i64| (chrono::Utc::now() - chrono::Duration::seconds(ago_s)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (status, fill) = api(addr, "POST", "/v1/jobs/console-tick/backfill", Some(json!({"from": at(3600), "to": at(60), "rate": 1})));
    assert_eq!(status, 201, "{fill}");
    b.goto("#/job/default/console-tick").await;
    b.wait_text("#backfills", "running", 30).await;
    b.el("#backfills button[data-backfill]").await.click().await.unwrap();
    b.el("#confirm-yes").await.click().await.unwrap();
    b.wait_text("#backfills", "cancelled", 30).await;
    b.shot("06a-backfill-cancelled").await;
    assert_eq!(api(addr, "GET", &format!("/v1/backfills/{}", fill["id"].as_str().unwrap()), None).1["state"], "cancelled");

    // A job with params: its page has a field per param; a trigger sends
    // what is typed there, and the run's page shows its values.
    let report = json!({"name": "console-report", "params": {"region": {"default": "eu"}, "date": {}},
        "executor": {"handler": {"name": "noop"}}});
    assert_eq!(api(addr, "POST", "/v1/jobs", Some(report)).0, 201);
    b.goto("#/job/default/console-report").await;
    b.fill("input.param[data-param='date']", "2026-12-01").await;
    b.el("button[data-act='trigger']").await.click().await.unwrap();
    let mut triggered = Vec::new();
    for _ in 0..300 {
        let (_, runs) = api(addr, "GET", "/v1/runs?job=console-report", None);
        triggered = runs["runs"].as_array().cloned().unwrap_or_default();
        if !triggered.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(triggered.len(), 1, "the console's trigger created one run");
    assert_eq!(triggered[0]["params"], json!({"date": "2026-12-01", "region": "eu"}), "unchanged defaults are left to the job");
    b.goto(&format!("#/run/{}", triggered[0]["id"].as_str().unwrap())).await;
    b.wait_text(".tbl", "2026-12-01", 30).await;
    b.shot("06b-run-params").await;

    // A job that takes webhook calls shows where to send them; a call's
    // run shows its payload.
    let hooked = json!({"name": "console-hook", "triggers": {"webhook": {"secret": "console"}},
        "executor": {"handler": {"name": "noop"}}});
    assert_eq!(api(addr, "POST", "/v1/jobs", Some(hooked)).0, 201);
    b.goto("#/job/default/console-hook").await;
    b.wait_text("#webhook", "/v1/hooks/default/console-hook", 30).await;
    let payload = br#"{"event":"deploy <finished>"}"#;
    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let (ts_text, sig) = (
        ts.to_string(),
        gnomon_server::signing::signature(
            "console-secret",
            ts,
            &gnomon_server::signing::Signed { namespace: "default", job: "console-hook", key: "", body: payload },
        ),
    );
    let headers = [("Gnomon-Timestamp", ts_text.as_str()), ("Gnomon-Signature", sig.as_str())];
    let (status, run) = http_with(None, addr, "POST", "/v1/hooks/default/console-hook", &headers, Some(payload)).unwrap();
    assert_eq!(status, 201, "{run}");
    b.goto(&format!("#/run/{}", run["id"].as_str().unwrap())).await;
    b.wait_text("#payload", "deploy <finished>", 30).await;
    b.shot("06c-run-payload").await;

    // A running attempt's output is tailed live on its run page.
    let talker = json!({"name": "console-talk", "executor": {"shell": {"command": "sh", "args": ["-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do echo \"line $i <b>\"; sleep 1; done"]}}});
    assert_eq!(api(addr, "POST", "/v1/jobs", Some(talker)).0, 201);
    let (s, run) = api(addr, "POST", "/v1/jobs/console-talk/trigger", None);
    assert_eq!(s, 201, "{run}");
    let talk = run["id"].as_str().unwrap().to_string();
    b.goto(&format!("#/run/{talk}")).await;
    b.wait_text("#live-output", "line 2 <b>", 30).await;
    b.wait_text("#live-output", "line 4 <b>", 30).await;
    b.shot("06d-run-live-output").await;
    assert_eq!(api(addr, "POST", &format!("/v1/runs/{talk}/cancel"), None).0 / 100, 2);

    // The other pages render with their data.
    b.goto("#/jobs").await;
    b.wait_text("#jobs-table", "console-slow", 30).await;
    b.shot("07-jobs").await;
    b.goto("#/workers").await;
    b.wait_text("table", "dev-worker", 30).await;
    b.shot("08-workers").await;
    b.goto("#/").await;
    b.wait_text("#card-leader", "dev", 30).await;
    // Each namespace's use of its quotas: one with quotas of its own is
    // listed with them.
    b.wait_text("#namespaces-table [data-namespace='team-q']", "1,234", 30).await;
    b.shot("09-overview").await;
    b.c.goto(&format!("{}/docs", b.base)).await.unwrap();
    b.wait_text("#ops", "/v1/schedules/preview", 30).await;
    b.shot("12-api-docs").await;
    b.goto("#/").await;
    b.wait_text("#card-leader", "dev", 30).await;
    b.c.set_window_size(390, 844).await.unwrap();
    b.goto("#/jobs").await;
    b.wait_text("#jobs-table", "console-echo", 30).await;
    b.shot("10-jobs-phone").await;
    b.c.set_window_size(1280, 1000).await.unwrap();

    // A viewer is not offered what it may not do.
    b.el("#signout").await.click().await.unwrap();
    b.wait_text("#signin-why", "", 30).await;
    b.fill("#signin-token", viewer).await;
    b.el("#signin-go").await.click().await.unwrap();
    b.wait_text("#who", "viewer", 30).await;
    b.goto("#/jobs").await;
    b.wait_text("#jobs-table", "console-echo", 30).await;
    let offered = |css: &'static str| async move { b.c.find_all(Locator::Css(css)).await.unwrap().len() };
    assert_eq!(offered("#new-job").await, 0, "a viewer is offered New job");
    assert_eq!(offered("button[data-act]").await, 0, "a viewer is offered job actions");
    b.goto(&format!("#/run/{id}")).await;
    b.wait_text(".card .st", "cancelled", 30).await;
    b.goto("#/job/default/console-echo").await;
    b.wait_text("h1", "console-echo", 30).await;
    assert_eq!(offered("button[data-act]").await + offered("a[href$='/edit']").await, 0, "a viewer is offered changes");
    b.shot("11-viewer-job").await;
}

/// Signs the browser in with the admin token.
async fn sign_in(b: &Browser) {
    b.goto("").await;
    b.wait_text("#signin-why", "", 30).await;
    b.fill("#signin-token", TOKEN).await;
    b.el("#signin-go").await.click().await.unwrap();
    b.wait_text("#who", "admin", 30).await;
}

/// What the browser drew in `svg`: each node's (job, run, state, class,
/// computed fill) and each edge label's (from, to, on, text).
type Drawn = (Vec<(String, String, String, String, String)>, Vec<(String, String, String, String)>);

async fn drawn(b: &Browser, svg: &str) -> Drawn {
    let script = format!(
        "const s = document.querySelector({svg:?}); if (!s) return null;
         return [[...s.querySelectorAll('.node')].map(n => [n.dataset.job, n.dataset.run || '', n.dataset.state || '', n.getAttribute('class'),
                   getComputedStyle(n.querySelector('rect')).fill]),
                 [...s.querySelectorAll('.edge-label')].map(e => [e.dataset.from, e.dataset.to, e.dataset.on, e.textContent])];"
    );
    let v = b.c.execute(&script, vec![]).await.unwrap();
    serde_json::from_value(v).unwrap_or_default()
}

/// Waits until `svg` holds `nodes` nodes, and returns what it drew.
async fn wait_drawn(b: &Browser, svg: &str, nodes: usize) -> Drawn {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = drawn(b, svg).await;
        if d.0.len() == nodes {
            return d;
        }
        if Instant::now() > deadline {
            b.shot("timeout").await;
            panic!("{svg} has {} nodes, not {nodes}: {d:?}", d.0.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_draws_pipelines_and_the_runs_of_an_instant() {
    let dir = tempfile::tempdir().unwrap();
    let (_viewer, entry) = new_credential("viewer-1", &["--role", "viewer"]);
    let auth_file = dir.path().join("auth.toml");
    std::fs::write(&auth_file, entry).unwrap();
    let (_dev, addr, _driver, driver_url) = start(dir.path(), &auth_file);
    // extract → transform → report (on any), extract → load (on failed),
    // extract → hold (a long run) → publish.
    let noop = |name: &str, after: serde_json::Value| json!({"name": name, "after": after, "executor": {"handler": {"name": "noop"}}});
    for spec in [
        json!({"name": "extract", "executor": {"handler": {"name": "noop"}}}),
        noop("transform", json!([{"job": "extract"}])),
        noop("load", json!([{"job": "extract", "on": "failed"}])),
        noop("report", json!([{"job": "transform", "on": "any"}])),
        json!({"name": "hold", "after": [{"job": "extract"}], "executor": {"shell": {"command": "sleep", "args": ["90"]}}}),
        noop("publish", json!([{"job": "hold"}])),
    ] {
        let (status, body) = api(&addr, "POST", "/v1/jobs", Some(spec));
        assert_eq!(status, 201, "{body}");
    }
    let (c, b) = browser(dir.path(), &driver_url, &addr).await;
    let walked = tokio::spawn({
        let addr = addr.clone();
        async move { draw(&b, &addr).await }
    })
    .await;
    let _ = c.close().await;
    if let Err(e) = walked {
        eprintln!("server log:\n{}", std::fs::read_to_string(dir.path().join("dev.log")).unwrap_or_default());
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn draw(b: &Browser, addr: &str) {
    sign_in(b).await;
    let edge = |from: &str, to: &str, on: &str| (from.to_string(), to.to_string(), on.to_string(), on.to_string());
    let sorted = |mut v: Vec<(String, String, String, String)>| {
        v.sort();
        v
    };

    // The first job's page draws every job after it, transitively, each
    // edge labelled with its `on`, each box a link to its job.
    b.goto("#/job/default/extract").await;
    let (nodes, labels) = wait_drawn(b, "#pipeline svg", 6).await;
    let mut jobs: Vec<&str> = nodes.iter().map(|n| n.0.as_str()).collect();
    jobs.sort();
    assert_eq!(jobs, ["extract", "hold", "load", "publish", "report", "transform"]);
    assert_eq!(
        sorted(labels),
        sorted(vec![
            edge("extract", "hold", "succeeded"),
            edge("extract", "load", "failed"),
            edge("extract", "transform", "succeeded"),
            edge("hold", "publish", "succeeded"),
            edge("transform", "report", "any"),
        ])
    );
    assert!(nodes.iter().any(|n| n.0 == "extract" && n.3.contains("self")), "{nodes:?}");
    b.shot("20-job-pipeline").await;
    // A job in the middle: its upstreams left, its downstreams right, and
    // not its upstream's other dependents.
    b.el("#pipeline a[data-job='transform']").await.click().await.unwrap();
    b.wait_text("h1", "default/transform", 30).await;
    let (nodes, labels) = wait_drawn(b, "#pipeline svg", 3).await;
    let sides: Vec<(String, String)> = {
        let script = "return [...document.querySelectorAll('#pipeline .node')].map(n => [n.dataset.job, n.dataset.side]).sort()";
        serde_json::from_value(b.c.execute(script, vec![]).await.unwrap()).unwrap()
    };
    let side = |j: &str, s: &str| (j.to_string(), s.to_string());
    assert_eq!(sides, [side("extract", "upstream"), side("report", "downstream"), side("transform", "self")], "{nodes:?}");
    assert_eq!(sorted(labels), sorted(vec![edge("extract", "transform", "succeeded"), edge("transform", "report", "any")]));
    b.shot("21-job-pipeline-middle").await;

    // A run of the first job: its instant's runs, each coloured by the
    // state the API gives it.
    let (status, run) = api(addr, "POST", "/v1/jobs/extract/trigger", None);
    assert_eq!(status, 201, "{run}");
    let root = run["id"].as_str().unwrap().to_string();
    let graph_states = || {
        let mut states = std::collections::BTreeMap::new();
        let mut todo = vec![root.clone()];
        while let Some(id) = todo.pop() {
            let (_, r) = api(addr, "GET", &format!("/v1/runs/{id}"), None);
            states.insert(r["job"].as_str().unwrap().to_string(), (id.clone(), r["state"].as_str().unwrap().to_string()));
            for g in r["graph"]["downstream"].as_array().into_iter().flatten() {
                if let Some(next) = g["id"].as_str() {
                    todo.push(next.to_string());
                }
            }
        }
        states
    };
    let settled = |s: &std::collections::BTreeMap<String, (String, String)>| {
        let state = |j: &str| s.get(j).map(|x| x.1.as_str()).unwrap_or("");
        ["extract", "transform", "report"].iter().all(|j| state(j) == "succeeded")
            && state("load") == "skipped"
            && state("hold") == "running"
            && state("publish") == "waiting"
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut states = graph_states();
    while !settled(&states) {
        assert!(Instant::now() < deadline, "the runs did not settle: {states:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        states = graph_states();
    }
    let colour = |state: &str| match state {
        "succeeded" => "rgb(31, 138, 76)",
        "skipped" => "rgb(238, 240, 243)",
        "running" => "rgb(43, 108, 176)",
        "waiting" => "rgb(203, 213, 225)",
        other => panic!("no colour expected for {other}"),
    };
    for from in ["extract", "publish"] {
        // From either end, the whole instant is drawn.
        b.goto(&format!("#/run/{}", states[from].0)).await;
        b.el(&format!("#graph .node.self[data-job='{from}']")).await;
        b.wait_text("#graph-legend", "cancelled", 30).await;
        let (nodes, labels) = wait_drawn(b, "#graph svg", 6).await;
        for (job, run, state, class, fill) in &nodes {
            let (id, want) = &states[job];
            assert_eq!((run, state), (id, want), "{job}: the node shows the run and state the API gives");
            assert!(class.split(' ').any(|c| c == format!("rs-{want}")), "{job}: class {class:?}");
            assert_eq!(fill, colour(want), "{job} ({want}) is drawn in its state's colour");
            assert_eq!(class.contains("self"), job == from, "{job}: {class}");
        }
        let mut ons: Vec<(String, String, String)> = labels.iter().map(|l| (l.0.clone(), l.1.clone(), l.2.clone())).collect();
        ons.sort();
        let run_edge = |a: &str, z: &str, on: &str| (states[a].0.clone(), states[z].0.clone(), on.to_string());
        let mut want = vec![
            run_edge("extract", "transform", "succeeded"),
            run_edge("extract", "load", "failed"),
            run_edge("extract", "hold", "succeeded"),
            run_edge("transform", "report", "any"),
            run_edge("hold", "publish", "succeeded"),
        ];
        want.sort();
        assert_eq!(ons, want);
        b.shot(&format!("22-run-graph-from-{from}")).await;
    }
    // A node opens its run.
    b.el(&format!("#graph a[data-run='{}']", states["load"].0)).await.click().await.unwrap();
    b.wait_text("h1", &states["load"].0, 30).await;
    b.wait_text(".card .st", "skipped", 30).await;
    let (status, _) = api(addr, "POST", &format!("/v1/runs/{}/cancel", states["hold"].0), None);
    assert!(status == 200 || status == 202, "{status}");
}
