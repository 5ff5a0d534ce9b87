use super::*;
use crate::isolation::JobUsers;
use gnomon_core::outcome::RetryHint;
use gnomon_core::spec::HandlerSpec;

fn req(executor: Executor, timeout: Option<Duration>) -> ExecRequest {
    ExecRequest {
        run_id: "job1-1000".into(),
        attempt: 2,
        job: "tick".into(),
        namespace: "default".into(),
        scheduled_at: 1000,
        token: 7,
        worker_id: "w-test".into(),
        executor,
        timeout,
        isolation: Arc::default(),
        egress: Arc::new(crate::egress::Egress::with_defaults()),
        params: None,
        payload: None,
        live: None,
    }
}

fn shell(command: &str, args: &[&str]) -> Executor {
    Executor::Shell(ShellSpec {
        command: command.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        cwd: None,
        keep_workdir: false,
        limits: None,
    })
}

fn never() -> watch::Receiver<bool> {
    watch::channel(false).1
}

#[tokio::test]
async fn shell_runs_argv_with_gnomon_env_and_no_interpolation() {
    let client = reqwest::Client::new();
    let out = execute(&req(shell("echo", &["hi", "$HOME"]), None), &client, &HandlerRegistry::default(), never()).await;
    assert_eq!((out.state, out.exit_code, out.output.as_str()), (AttemptState::Succeeded, Some(0), "hi $HOME\n"));
    let out = execute(
        &req(shell("sh", &["-c", "echo $GNOMON_RUN_ID $GNOMON_ATTEMPT $GNOMON_SCHEDULED_AT $GNOMON_JOB $GNOMON_WORKER $GNOMON_FENCE_TOKEN; echo err >&2; exit 3"]), None),
        &client,
        &HandlerRegistry::default(),
        never(),
    )
    .await;
    assert_eq!(out.state, AttemptState::Failed);
    assert_eq!(out.exit_code, Some(3));
    assert!(out.output.contains("job1-1000 2 1970-01-01T00:00:01.000Z tick w-test 7\n"), "{}", out.output);
    assert!(out.output.contains("err\n"));
}

#[tokio::test]
async fn a_job_gets_a_clean_environment_and_a_private_directory_of_its_own() {
    std::env::set_var("GNOMON_TOKEN", "the-workers-own-credential");
    let root = tempfile::tempdir().unwrap();
    let iso = Arc::new(Isolation::new(Some(root.path().join("work")), JobUsers::Own, None).unwrap());
    let mut r = req(shell("sh", &["-c", "env; echo cwd=$(pwd); touch here"]), None);
    r.isolation = iso.clone();
    let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
    assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
    assert!(!out.output.contains("the-workers-own-credential"), "{}", out.output);
    assert!(out.output.contains("GNOMON_FENCE_TOKEN=7") && out.output.contains("PATH="), "{}", out.output);
    let cwd = out.output.lines().find_map(|l| l.strip_prefix("cwd=")).unwrap().to_string();
    assert!(cwd.starts_with(root.path().to_str().unwrap()), "{cwd}");
    assert!(!std::path::Path::new(&cwd).exists(), "the directory is removed after the attempt");
    // keep_workdir keeps it.
    let Executor::Shell(mut spec) = shell("sh", &["-c", "pwd"]) else { unreachable!() };
    spec.keep_workdir = true;
    let mut r = req(Executor::Shell(spec), None);
    r.isolation = iso;
    let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
    assert!(std::path::Path::new(out.output.trim()).is_dir(), "{}", out.output);
}

#[tokio::test]
async fn limits_apply_to_the_job() {
    let Executor::Shell(mut spec) = shell("sh", &["-c", "ulimit -n; ulimit -v"]) else { unreachable!() };
    spec.limits = Some(gnomon_core::spec::Limits { open_files: Some(64), memory: Some("256MiB".into()), ..Default::default() });
    let out = execute(&req(Executor::Shell(spec), None), &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
    assert_eq!(out.output, "64\n262144\n", "{}", out.output);
    // Past its CPU time the job is killed (SIGXCPU), long before the timeout.
    let Executor::Shell(mut spec) = shell("sh", &["-c", "while :; do :; done"]) else { unreachable!() };
    spec.limits = Some(gnomon_core::spec::Limits { cpu_seconds: Some(1), ..Default::default() });
    let out =
        execute(&req(Executor::Shell(spec), Some(Duration::from_secs(120))), &reqwest::Client::new(), &HandlerRegistry::default(), never())
            .await;
    assert_eq!(out.state, AttemptState::Failed, "{}", out.output);
}

#[tokio::test]
async fn run_as_drops_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("run_as_drops_root: not root here; nothing to drop");
        return;
    }
    let user = crate::isolation::RunAs::lookup("nobody").unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut r = req(shell("sh", &["-c", "id -u; echo $HOME $USER; touch x && echo wrote"]), None);
    r.isolation = Arc::new(Isolation::new(Some(root.path().join("work")), JobUsers::One(user.clone()), None).unwrap());
    let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
    assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
    assert!(
        out.output.starts_with(&format!("{}\n", user.uid)) && out.output.contains("nobody") && out.output.contains("wrote"),
        "{}",
        out.output
    );
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let marker = std::env::temp_dir().join(format!("gnomon-pg-{}", rand_suffix()));
    let script = format!("sleep 60 & echo $! > {}; wait", marker.display());
    let out = execute(
        &req(shell("sh", &["-c", &script]), Some(Duration::from_millis(500))),
        &reqwest::Client::new(),
        &HandlerRegistry::default(),
        never(),
    )
    .await;
    assert_eq!(out.state, AttemptState::TimedOut);
    let pid: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    let _ = std::fs::remove_file(&marker);
    // The grandchild `sleep 60` is gone too (allow a moment for reaping).
    assert!(gone(pid).await, "background child {pid} survived the timeout");
}

/// Waits (bounded) for `pid` to be gone; false if it is still alive.
async fn gone(pid: i32) -> bool {
    for _ in 0..50 {
        // SAFETY: signal 0 only checks for existence.
        if unsafe { libc::kill(pid, 0) } != 0 || is_zombie(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn with_cgroups_nothing_an_attempt_started_outlives_it_even_outside_its_process_group() {
    let cgroups = match crate::cgroup::Cgroups::shared(crate::cgroup::Mode::Auto) {
        Ok(Some(c)) => c,
        other => {
            eprintln!("no usable cgroup v2 here ({other:?}); the setrlimit path is what runs");
            return;
        }
    };
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("escaped");
    // `setsid` puts the sleeper in a session and group of its own: the
    // process-group kill cannot reach it; the cgroup's kill does.
    let script = format!("setsid sleep 300 > /dev/null 2>&1 & echo $! > {}; cat /proc/self/cgroup", marker.display());
    let mut r = req(shell("sh", &["-c", &script]), None);
    r.isolation = Arc::new(Isolation::new(Some(root.path().join("work")), JobUsers::Own, Some(cgroups.clone())).unwrap());
    let out = execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
    assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
    let rel = cgroups.base.file_name().unwrap().to_string_lossy().to_string();
    assert!(out.output.contains(&format!("/gnomon-jobs/{rel}/job1-1000-2-")), "the job ran in its attempt's cgroup: {}", out.output);
    let pid: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    assert!(gone(pid).await, "the escaped process {pid} survived its attempt");
    // The attempt's cgroup is removed.
    let left: Vec<_> = std::fs::read_dir(&cgroups.base).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().starts_with("job1-1000-2-")), "{left:?}");
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.contains(") Z ")).unwrap_or(true)
}

fn rand_suffix() -> String {
    format!("{}-{:?}", std::process::id(), std::time::SystemTime::now()).chars().filter(|c| c.is_ascii_alphanumeric()).collect()
}

#[tokio::test]
async fn cancel_stops_shell() {
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        execute(&req(shell("sleep", &["60"]), None), &reqwest::Client::new(), &HandlerRegistry::default(), rx).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.send(true).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
    assert_eq!(out.state, AttemptState::Cancelled);
}

#[tokio::test]
async fn missing_command_fails_cleanly() {
    let out = execute(&req(shell("/nonexistent/binary", &[]), None), &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
    assert_eq!(out.state, AttemptState::Failed);
    assert!(out.output.contains("cannot start"));
}

#[tokio::test]
async fn http_sends_gnomon_headers_and_checks_status() {
    use axum::{http::HeaderMap, routing::any, Router};
    let app = Router::new()
        .route(
            "/ok",
            any(|h: HeaderMap| async move {
                format!("run={} token={}", h["gnomon-run-id"].to_str().unwrap(), h["gnomon-fence-token"].to_str().unwrap())
            }),
        )
        .route("/teapot", any(|| async { (axum::http::StatusCode::IM_A_TEAPOT, "short and stout") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = |path: &str, expect: Option<u16>| {
        Executor::Http(HttpSpec {
            method: "POST".into(),
            url: format!("http://{addr}{path}"),
            headers: Default::default(),
            body: Some("{}".into()),
            expect_status: expect,
        })
    };
    let client = reqwest::Client::new();
    let out = execute(&req(http("/ok", None), None), &client, &HandlerRegistry::default(), never()).await;
    assert_eq!((out.state, out.exit_code, out.output.as_str()), (AttemptState::Succeeded, Some(200), "run=job1-1000 token=7"));
    let out = execute(&req(http("/teapot", None), None), &client, &HandlerRegistry::default(), never()).await;
    assert_eq!((out.state, out.exit_code), (AttemptState::Failed, Some(418)));
    let out = execute(&req(http("/teapot", Some(418)), None), &client, &HandlerRegistry::default(), never()).await;
    assert_eq!(out.state, AttemptState::Succeeded);
}

fn with_params(mut r: ExecRequest) -> ExecRequest {
    r.params = Some(serde_json::from_value(serde_json::json!({"region": "eu west", "limit": 5, "opts": {"dry": true}})).unwrap());
    r
}

#[tokio::test]
async fn a_shell_job_gets_its_params_in_the_environment_and_a_private_file() {
    let script = r#"echo "$GNOMON_PARAM_REGION|$GNOMON_PARAM_LIMIT|$GNOMON_PARAM_OPTS"; stat -c %a "$GNOMON_PARAMS_FILE"; cat "$GNOMON_PARAMS_FILE""#;
    let client = reqwest::Client::new();
    // In the fresh working directory, and beside a job's own `cwd`.
    for cwd in [None, Some(std::env::temp_dir().display().to_string())] {
        let Executor::Shell(mut spec) = shell("sh", &["-c", script]) else { unreachable!() };
        spec.cwd = cwd.clone();
        let out = execute(&with_params(req(Executor::Shell(spec), None)), &client, &HandlerRegistry::default(), never()).await;
        assert_eq!(out.state, AttemptState::Succeeded, "{cwd:?}: {}", out.output);
        let lines: Vec<&str> = out.output.lines().collect();
        assert_eq!(lines[0], r#"eu west|5|{"dry":true}"#, "{cwd:?}");
        assert_eq!(lines[1], "600", "the params file is the job's alone");
        assert_eq!(lines[2], r#"{"limit":5,"opts":{"dry":true},"region":"eu west"}"#);
    }
    let out =
        execute(&req(shell("sh", &["-c", "echo ${GNOMON_PARAMS_FILE:-none}"]), None), &client, &HandlerRegistry::default(), never()).await;
    assert_eq!(out.output.trim(), "none", "a run without params has no params file");
}

/// A body-less POST job to a loopback server that answers with the
/// request's content type and body.
async fn echo_server() -> HttpSpec {
    use axum::{http::HeaderMap, routing::any, Router};
    let app = Router::new()
        .route("/p", any(|h: HeaderMap, body: String| async move { format!("{} {body}", h["content-type"].to_str().unwrap_or("")) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    HttpSpec { method: "POST".into(), url: format!("http://{addr}/p"), headers: Default::default(), body: None, expect_status: None }
}

#[tokio::test]
async fn an_http_job_without_a_body_is_sent_its_params_and_a_handler_sees_them() {
    let spec = echo_server().await;
    let out = execute(&with_params(req(Executor::Http(spec), None)), &reqwest::Client::new(), &HandlerRegistry::default(), never()).await;
    assert_eq!(out.output, r#"application/json {"limit":5,"opts":{"dry":true},"region":"eu west"}"#);

    struct Params;
    #[async_trait::async_trait]
    impl Handler for Params {
        async fn call(&self, ctx: HandlerContext, _: serde_json::Value) -> Result<String, HandlerError> {
            Ok(serde_json::to_string(&ctx.params).unwrap())
        }
    }
    let mut reg = HandlerRegistry::default();
    reg.register("params", Arc::new(Params));
    let h = Executor::Handler(HandlerSpec { name: "params".into(), payload: serde_json::Value::Null });
    let out = execute(&with_params(req(h, None)), &reqwest::Client::new(), &reg, never()).await;
    assert_eq!(out.output, r#"{"limit":5,"opts":{"dry":true},"region":"eu west"}"#);
}

#[tokio::test]
async fn handlers_and_unknown_handler() {
    let reg = HandlerRegistry::with_builtins();
    let h = |name: &str| Executor::Handler(HandlerSpec { name: name.into(), payload: serde_json::json!({"a": 1}) });
    let out = execute(&req(h("echo"), None), &reqwest::Client::new(), &reg, never()).await;
    assert_eq!((out.state, out.output.as_str()), (AttemptState::Succeeded, r#"{"a":1}"#));
    let out = execute(&req(h("missing"), None), &reqwest::Client::new(), &reg, never()).await;
    assert_eq!(out.state, AttemptState::Failed);
    assert!(out.output.contains("no handler named"));
}

#[tokio::test]
async fn a_webhook_payload_reaches_shell_http_and_handler_jobs() {
    let payload = "{\"ref\":\"main\",\"note\":\"caf\u{e9}\"}";
    let with_payload = |mut r: ExecRequest| {
        r.payload = Some(payload.to_string());
        r
    };
    let client = reqwest::Client::new();
    let script = r#"stat -c %a "$GNOMON_PAYLOAD_FILE"; cat "$GNOMON_PAYLOAD_FILE"; echo; echo "${GNOMON_PARAMS_FILE:-no params}""#;
    for cwd in [None, Some(std::env::temp_dir().display().to_string())] {
        let Executor::Shell(mut spec) = shell("sh", &["-c", script]) else { unreachable!() };
        spec.cwd = cwd.clone();
        let out = execute(&with_payload(req(Executor::Shell(spec), None)), &client, &HandlerRegistry::default(), never()).await;
        assert_eq!(out.state, AttemptState::Succeeded, "{cwd:?}: {}", out.output);
        let lines: Vec<&str> = out.output.lines().collect();
        assert_eq!(lines, ["600", payload, "no params"], "{cwd:?}");
    }
    let out =
        execute(&req(shell("sh", &["-c", "echo ${GNOMON_PAYLOAD_FILE:-none}"]), None), &client, &HandlerRegistry::default(), never()).await;
    assert_eq!(out.output.trim(), "none", "a run without a payload has no payload file");

    let spec = echo_server().await;
    // The payload wins over the params for the body; text that is not
    // JSON goes as text.
    let out =
        execute(&with_payload(with_params(req(Executor::Http(spec.clone()), None))), &client, &HandlerRegistry::default(), never()).await;
    assert_eq!(out.output, format!("application/json {payload}"));
    let mut text = req(Executor::Http(spec), None);
    text.payload = Some("plain words".into());
    let out = execute(&text, &client, &HandlerRegistry::default(), never()).await;
    assert_eq!(out.output, "text/plain; charset=utf-8 plain words");

    struct Echo;
    #[async_trait::async_trait]
    impl Handler for Echo {
        async fn call(&self, ctx: HandlerContext, own: serde_json::Value) -> Result<String, HandlerError> {
            Ok(format!("{} {own}", ctx.run_payload.unwrap_or_default()))
        }
    }
    let mut reg = HandlerRegistry::default();
    reg.register("echo", Arc::new(Echo));
    let h = Executor::Handler(HandlerSpec { name: "echo".into(), payload: serde_json::json!({"own": 1}) });
    let out = execute(&with_payload(req(h, None)), &client, &reg, never()).await;
    assert_eq!(out.output, format!("{payload} {{\"own\":1}}"));
}

/// Runs `script` as a job of `namespace` with params on `iso`, keeping its
/// working directory.
async fn in_namespace(iso: &Arc<Isolation>, namespace: &str, script: &str) -> ExecOutcome {
    let Executor::Shell(mut spec) = shell("sh", &["-c", script]) else { unreachable!() };
    spec.keep_workdir = true;
    let mut r = with_params(req(Executor::Shell(spec), None));
    r.namespace = namespace.into();
    r.run_id = format!("{namespace}-run");
    r.isolation = iso.clone();
    execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await
}

#[tokio::test]
async fn each_namespace_runs_as_a_uid_of_its_own_that_others_cannot_read() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test switches users: it needs root (run the tests as root)");
    let data = tempfile::tempdir().unwrap();
    let alloc = crate::isolation::UidAllocator::open(data.path(), crate::isolation::UidRange::parse("910000-910001").unwrap()).unwrap();
    let iso = Arc::new(Isolation::new(Some(data.path().join("work")), JobUsers::PerNamespace(Arc::new(alloc)), None).unwrap());
    let me = r#"echo "ID=$(id -u):$(id -g):$(id -G)"; echo "HOME=$HOME PWD=$(pwd)"; stat -c 'FILE=%u:%g:%a' "$GNOMON_PARAMS_FILE"; stat -c 'DIR=%u:%a' .; cat "$GNOMON_PARAMS_FILE" >/dev/null && echo OWN:readable"#;
    let a = in_namespace(&iso, "a", me).await;
    assert_eq!(a.state, AttemptState::Succeeded, "{}", a.output);
    let line = |out: &str, k: &str| out.lines().find_map(|l| l.strip_prefix(k)).unwrap_or_else(|| panic!("{k} in {out}")).to_string();
    assert_eq!(line(&a.output, "ID="), "910000:910000:910000", "the uid, its own group and no other");
    assert_eq!((line(&a.output, "FILE="), line(&a.output, "DIR=")), ("910000:910000:600".into(), "910000:700".into()));
    assert!(a.output.contains("OWN:readable"), "{}", a.output);
    let home = line(&a.output, "HOME=");
    let (h, pwd) = home.split_once(" PWD=").unwrap();
    assert_eq!(h, pwd, "a namespace's uid has the attempt's directory as its home");
    // Another namespace's job: another uid, and a's directory and files
    // (kept) are out of its reach.
    let peek = format!(
        r#"echo "ID=$(id -u)"; ls {pwd} >/dev/null 2>&1 || echo LS:denied; cat {pwd}/gnomon-params.json >/dev/null 2>&1 || echo PARAMS:denied; touch {pwd}/x 2>/dev/null || echo WRITE:denied; cat "$GNOMON_PARAMS_FILE" >/dev/null && echo OWN:readable"#
    );
    let b = in_namespace(&iso, "b", &peek).await;
    assert_eq!(line(&b.output, "ID="), "910001", "{}", b.output);
    for denied in ["LS:denied", "PARAMS:denied", "WRITE:denied", "OWN:readable"] {
        assert!(b.output.contains(denied), "{denied}: {}", b.output);
    }
    // The range holds two uids: a third namespace's attempt fails, saying why.
    let c = in_namespace(&iso, "c", "id -u").await;
    assert_eq!(c.state, AttemptState::Failed);
    assert!(c.output.contains("no uid left for namespace \"c\""), "{}", c.output);
    assert_eq!(in_namespace(&iso, "a", "id -u").await.output.trim(), "910000", "a keeps its uid");
}

/// A handler's log lines come before what it returns, in the output and
/// in the live stream; its error says how the run should retry.
#[tokio::test]
async fn a_handler_logs_live_and_steers_its_retry() {
    struct Steer;
    #[async_trait::async_trait]
    impl Handler for Steer {
        async fn call(&self, ctx: HandlerContext, how: serde_json::Value) -> Result<String, HandlerError> {
            ctx.log.line(format!("attempt {} of {}", ctx.attempt, ctx.run_id));
            assert_eq!(ctx.fence(), crate::Fence { run_id: ctx.run_id.clone(), attempt: ctx.attempt, token: ctx.token });
            assert!(!ctx.is_cancelled());
            match how.as_str() {
                Some("never") => Err(HandlerError::non_retryable("bad input")),
                Some("later") => Err(HandlerError::retry_after(Duration::from_secs(90), "rate limited")),
                Some("plain") => Err("boom")?,
                _ => Ok("done".into()),
            }
        }
    }
    let mut reg = HandlerRegistry::default();
    reg.register("steer", Arc::new(Steer));
    let client = reqwest::Client::new();
    for (how, state, retry, last) in [
        ("ok", AttemptState::Succeeded, RetryHint::Policy, "done"),
        ("never", AttemptState::Failed, RetryHint::Never, "bad input"),
        ("later", AttemptState::Failed, RetryHint::After(90_000), "rate limited"),
        ("plain", AttemptState::Failed, RetryHint::Policy, "boom"),
    ] {
        let live = crate::live::LiveSink::default();
        let mut r = req(Executor::Handler(HandlerSpec { name: "steer".into(), payload: serde_json::json!(how) }), None);
        r.live = Some(live.clone());
        let out = execute(&r, &client, &reg, never()).await;
        assert_eq!((out.state, out.retry), (state, retry), "{how}");
        assert_eq!(out.output, format!("attempt 2 of job1-1000\n{last}"), "{how}");
        assert_eq!(
            live.take_all().into_iter().flat_map(|(_, d)| d).collect::<Vec<u8>>(),
            format!("attempt 2 of job1-1000\n{last}").into_bytes(),
            "{how}: streamed, to its end"
        );
    }
}

/// A shell job's output is streamed as it is written, not only kept.
#[tokio::test]
async fn a_shell_jobs_output_is_streamed_while_it_runs() {
    let live = crate::live::LiveSink::default();
    let mut r = req(shell("sh", &["-c", "echo one; sleep 1; echo two"]), None);
    r.live = Some(live.clone());
    let run = tokio::spawn(async move { execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await });
    let mut first = None;
    for _ in 0..200 {
        if let Some(p) = live.take_piece() {
            first = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(first, Some((0, b"one\n".to_vec())), "the first line arrives before the job ends");
    assert!(!run.is_finished());
    let out = run.await.unwrap();
    assert_eq!(out.output, "one\ntwo\n");
    assert_eq!(live.take_piece(), Some((4, b"two\n".to_vec())));
}

/// A job's own `cwd`: one directory only root can enter (0700, root's),
/// one its user can, and a world-writable one for the markers its command
/// leaves. The parent is 0755 so any user reaches the two.
fn cwd_dirs(owner: (u32, u32)) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(base.path(), 0o755);
    let (closed, open, marks) = (base.path().join("closed"), base.path().join("open"), base.path().join("marks"));
    for (d, m) in [(&closed, 0o700), (&open, 0o700), (&marks, 0o1777)] {
        std::fs::create_dir(d).unwrap();
        mode(d, m);
    }
    std::os::unix::fs::chown(&open, Some(owner.0), Some(owner.1)).unwrap();
    (base, closed, open, marks)
}

/// Runs `sh -c "touch MARK; pwd"` with `cwd` as a job of `namespace` on
/// `iso`, with params (so the attempt also has a file directory beside).
async fn in_cwd(iso: &Arc<Isolation>, namespace: &str, cwd: &std::path::Path, mark: &std::path::Path) -> ExecOutcome {
    let script = format!("touch {}; echo PWD=$(pwd)", mark.display());
    let Executor::Shell(mut spec) = shell("sh", &["-c", &script]) else { unreachable!() };
    spec.cwd = Some(cwd.display().to_string());
    let mut r = with_params(req(Executor::Shell(spec), None));
    r.namespace = namespace.into();
    r.isolation = iso.clone();
    execute(&r, &reqwest::Client::new(), &HandlerRegistry::default(), never()).await
}

/// The attempt in a `cwd` its user cannot enter failed, saying so, and
/// its command never ran.
fn assert_refused(out: &ExecOutcome, cwd: &std::path::Path, uid: u32, mark: &std::path::Path) {
    assert_eq!(out.state, AttemptState::Failed, "{}", out.output);
    assert!(!mark.exists(), "the command never ran: {}", out.output);
    assert!(
        out.output.contains(&format!("cannot enter the job's working directory {:?} as uid {uid}", cwd.display().to_string()))
            && out.output.contains("Permission denied"),
        "{}",
        out.output
    );
}

#[tokio::test]
async fn a_jobs_cwd_is_entered_as_its_user_never_as_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test switches users: it needs root (run the tests as root)");
    let user = crate::isolation::RunAs::lookup("nobody").unwrap();
    let (base, closed, open, marks) = cwd_dirs((user.uid, user.gid));
    let iso = Arc::new(Isolation::new(Some(base.path().join("work")), JobUsers::One(user.clone()), None).unwrap());
    let mark = marks.join("closed");
    let out = in_cwd(&iso, "default", &closed, &mark).await;
    assert_refused(&out, &closed, user.uid, &mark);
    // One its user can enter: its own, and one anyone can.
    let mark = marks.join("open");
    let out = in_cwd(&iso, "default", &open, &mark).await;
    assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
    assert!(mark.exists() && out.output.contains(&format!("PWD={}", open.display())), "{}", out.output);
    let out = in_cwd(&iso, "default", base.path(), &marks.join("base")).await;
    assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
    // Without a user switch, the worker's own user enters what it can.
    let own = Arc::new(Isolation::new(Some(base.path().join("work-own")), JobUsers::Own, None).unwrap());
    let out = in_cwd(&own, "default", &closed, &marks.join("own")).await;
    assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
    assert!(out.output.contains(&format!("PWD={}", closed.display())), "{}", out.output);
}

#[tokio::test]
async fn a_namespaces_uid_enters_a_jobs_cwd_as_itself() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test switches users: it needs root (run the tests as root)");
    let data = tempfile::tempdir().unwrap();
    let alloc = crate::isolation::UidAllocator::open(data.path(), crate::isolation::UidRange::parse("920000-920001").unwrap()).unwrap();
    let (base, closed, open, marks) = cwd_dirs((920000, 920000));
    let iso = Arc::new(Isolation::new(Some(base.path().join("work")), JobUsers::PerNamespace(Arc::new(alloc)), None).unwrap());
    let mark = marks.join("a-closed");
    assert_refused(&in_cwd(&iso, "a", &closed, &mark).await, &closed, 920000, &mark);
    let mark = marks.join("a-open");
    let out = in_cwd(&iso, "a", &open, &mark).await;
    assert_eq!(out.state, AttemptState::Succeeded, "{}", out.output);
    assert!(mark.exists() && out.output.contains(&format!("PWD={}", open.display())), "{}", out.output);
    // Namespace b's uid cannot enter a's directory.
    let mark = marks.join("b-open");
    assert_refused(&in_cwd(&iso, "b", &open, &mark).await, &open, 920001, &mark);
}
