//! Who may speak the raft protocol: only a member credential (derived from
//! the shared token, or a `member` entry of the auth file), and a write a
//! member forwards is checked against the client it names, as the API
//! operation would be, and audited. One `raft://` member on loopback.

use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::*;

/// The member's shared admin credential.
const TOKEN: &str = "raft-test-admin-credential-0123456789";

fn http(addr: &str, method: &str, path: &str, body: Option<&[u8]>) -> std::io::Result<(u16, Value)> {
    http_as(Some(TOKEN), addr, method, path, body)
}

/// Raft calls need a member credential: none, a wrong one, the admin
/// token itself and a namespace-limited admin are refused; the credential
/// the members derive from their shared token is answered. A write another
/// member forwards is checked against the caller it names as the API
/// operation would be, and audited.
#[test]
fn raft_traffic_needs_a_member_credential_and_forwarded_writes_their_callers() {
    let dir = tempfile::tempdir().unwrap();
    let (admin_a, entry) = new_credential("admin-a", &["--role", "admin", "--namespace", "teama"]);
    let (m1_token, m1_entry) = new_credential("m1", &["--role", "member"]);
    let auth = dir.path().join("auth.toml");
    std::fs::write(&auth, [entry, m1_entry].join("\n\n")).unwrap();
    let m1_file = dir.path().join("m1.token");
    std::fs::write(&m1_file, &m1_token).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let args: Vec<String> = [
        "server",
        "--store",
        &format!("raft://{}", dir.path().join("m1").display()),
        "--raft-id",
        "1",
        "--raft-peers",
        &format!("1={addr}"),
        "--raft-bootstrap",
        "--listen",
        &addr,
        "--token",
        TOKEN,
        "--auth-file",
        &auth.display().to_string(),
        "--raft-token-file",
        &m1_file.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let member = Proc::spawn(dir.path(), "m1", &args);
    wait_until(
        "the member to lead",
        Duration::from_secs(30),
        || matches!(http(&addr, "GET", "/v1/leader", None), Ok((200, v)) if v["is_self"] == json!(true)),
    );
    for ns in ["teama", "teamb"] {
        let job = json!({"name": "j", "namespace": ns, "schedule": {"every": "1h"}, "executor": {"shell": {"command": "true"}}});
        let (s, v) = http(&addr, "POST", "/v1/jobs", Some(job.to_string().as_bytes())).unwrap();
        assert_eq!(s, 201, "{v}");
    }
    // What the members derive from the shared token (HMAC-SHA256 of a
    // fixed purpose, hex).
    let member_token = {
        use hmac::Mac;
        let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(TOKEN.as_bytes()).unwrap();
        mac.update(b"gnomon raft member credential v1");
        hex::encode(mac.finalize().into_bytes())
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let request = |token: Option<&str>, json: Vec<u8>, caller: Option<Value>| {
            let mut req = tonic::Request::new(gnomon_proto::raft::Payload { json, wall_ms: 0 });
            if let Some(t) = token {
                req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
            }
            if let Some(c) = caller {
                req.metadata_mut().insert_bin("gnomon-caller-bin", tonic::metadata::MetadataValue::from_bytes(c.to_string().as_bytes()));
            }
            req
        };
        let refusals = [
            (None, tonic::Code::Unauthenticated),
            (Some("not-a-credential-at-all"), tonic::Code::Unauthenticated),
            (Some(TOKEN), tonic::Code::PermissionDenied),
            (Some(admin_a.as_str()), tonic::Code::PermissionDenied),
        ];
        for (token, code) in refusals {
            let mut client = gnomon_proto::raft::raft_client::RaftClient::new(channel.clone());
            let e = client.read_index(request(token, b"1".to_vec(), None)).await.expect_err("refused");
            assert_eq!(e.code(), code, "{token:?}: {e:?}");
        }
        let mut client = gnomon_proto::raft::raft_client::RaftClient::new(channel);
        // The derived credential and a member entry of the auth file.
        for token in [&member_token, &m1_token] {
            let answer = client.read_index(request(Some(token), b"1".to_vec(), None)).await.expect("answered").into_inner();
            let v: Value = serde_json::from_slice(&answer.json).unwrap();
            assert!(v.get("Ok").is_some(), "{v}");
        }

        // A forwarded write for a caller limited to teama: teamb's job
        // stays, teama's goes.
        let delete = |ns: &str| {
            json!({"from": 2, "command": {"DeleteJob": {"namespace": ns, "name": "j", "precondition": "None"}}}).to_string().into_bytes()
        };
        let caller = json!({"name": "admin-a", "role": "admin", "namespaces": ["teama"]});
        let e = client.forward(request(Some(&member_token), delete("teamb"), Some(caller.clone()))).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let operator = json!({"name": "op", "role": "operator", "namespaces": null});
        let e = client.forward(request(Some(&member_token), delete("teamb"), Some(operator))).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let answer = client.forward(request(Some(&member_token), delete("teama"), Some(caller))).await.expect("applied").into_inner();
        let v: Value = serde_json::from_slice(&answer.json).unwrap();
        assert_eq!(v, json!({"Ok": {"Ok": "Done"}}), "{v}");
    });
    assert_eq!(http(&addr, "GET", "/v1/jobs/j?namespace=teamb", None).unwrap().0, 200, "refused writes changed nothing");
    assert_eq!(http(&addr, "GET", "/v1/jobs/j?namespace=teama", None).unwrap().0, 404);
    wait_until("the audit lines", Duration::from_secs(10), || {
        let log = member.log();
        log.contains("raft call refused") && log.contains("forwarded write refused") && log.contains("forwarded deleting a job")
    });
}
