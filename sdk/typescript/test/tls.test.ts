// TLS: the worker trusts `tls.ca` and presents `tls.cert`/`tls.key` (mutual TLS).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { Peer, until, assign } from "./peer";
import { startWorker } from "./helpers";
import { Outcome } from "../src/proto";

function haveOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA. */
function pki(dir: string) {
  const run = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
  run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem");
  fs.writeFileSync(path.join(dir, "san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  for (const who of ["server", "client"]) {
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", `/CN=${who}`, "-keyout", `${who}.key`, "-out", `${who}.csr`);
    run("x509", "-req", "-in", `${who}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", `${who}.pem`);
  }
  const read = (f: string) => fs.readFileSync(path.join(dir, f));
  return { ca: read("ca.pem"), serverCert: read("server.pem"), serverKey: read("server.key") };
}

test("mutual TLS with a private CA", { skip: !haveOpenssl() && "no openssl" }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gnomon-tls-"));
  const p = pki(dir);
  const creds = grpc.ServerCredentials.createSsl(p.ca, [{ cert_chain: p.serverCert, private_key: p.serverKey }], true);
  const peer = await new Peer().start(0, creds);
  const w = startWorker(peer, { tls: { ca: path.join(dir, "ca.pem"), cert: path.join(dir, "client.pem"), key: path.join(dir, "client.key") } }, (w) => w.handler("h", () => "over tls"));
  // Without a client certificate the handshake fails: a transient loss, retried.
  const anon = startWorker(peer, { workerId: "anon", tls: { ca: path.join(dir, "ca.pem") } }, (w) => w.handler("h", () => "x"));
  try {
    await until("session", () => peer.sessions.length >= 1);
    const a = assign("h");
    peer.current.send({ assign: a });
    await until("report", () => peer.reports(a.run_id).length === 1);
    assert.deepEqual([peer.reports(a.run_id)[0]!.outcome, peer.reports(a.run_id)[0]!.output], [Outcome.SUCCEEDED, "over tls"]);
    await until("anon retried", () => anon.log.records.filter((r) => r.message.includes("reconnecting")).length >= 2);
    assert.ok(peer.sessions.every((s) => s.hello?.worker_id !== "anon"));
  } finally {
    await anon.worker.stop();
    await Promise.all([w.stop(), anon.done]);
    await peer.stop();
  }
});
