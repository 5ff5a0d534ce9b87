/**
 * The connection loop: one gRPC session at a time to one of the servers,
 * `NotLeader` redirects, reconnects with jittered backoff, heartbeats, and
 * the drain.
 *
 * @packageDocumentation
 */
import * as fs from "node:fs";
import * as grpc from "@grpc/grpc-js";
import { abandonStuck, describe } from "./attempts";
import type { TlsOptions } from "./options";
import { MAX_MESSAGE_BYTES, workerService, type ServerMessage, type Welcome, type WorkerMessage } from "./proto";
import type { Runtime } from "./runtime";

/** First reconnect delay, doubled after each failure up to {@link BACKOFF_MAX_MS}. */
export const BACKOFF_MIN_MS = 100;
/** The longest reconnect delay: a worker must be back well within a new leader's lease. */
export const BACKOFF_MAX_MS = 2000;
/**
 * How long a drain waits for acks, and for stopped handlers, after its
 * deadline; handlers still running then are reported lost and left behind.
 */
export const DRAIN_ACK_WAIT_MS = 5000;
const CONNECT_TIMEOUT_MS = 3000;

/** How a session ended. */
export type SessionEnd =
  | { kind: "redirect"; to: string }
  | { kind: "refused"; why: string }
  | { kind: "lost"; why: string }
  | { kind: "drained" };

/** gRPC statuses that mean the Hello was refused (bad Hello, duplicate id, auth). */
const REFUSALS = new Set<number>([
  grpc.status.FAILED_PRECONDITION,
  grpc.status.INVALID_ARGUMENT,
  grpc.status.ALREADY_EXISTS,
  grpc.status.UNAUTHENTICATED,
  grpc.status.PERMISSION_DENIED,
]);

/** A refusal or a transient loss, from a gRPC error. */
export function endOfStatus(e: Partial<grpc.ServiceError>): SessionEnd {
  const code = e.code ?? grpc.status.UNKNOWN;
  if (REFUSALS.has(code)) return { kind: "refused", why: `${grpc.status[code]}: ${e.details ?? e.message ?? ""}` };
  return { kind: "lost", why: `${grpc.status[code] ?? code}: ${e.details ?? e.message ?? ""}` };
}

/** The channel credentials for `tls` (files read now, so renewed ones are picked up). */
export function channelCredentials(tls: TlsOptions | undefined): grpc.ChannelCredentials {
  if (!tls) return grpc.credentials.createInsecure();
  const read = (p?: string) => (p ? fs.readFileSync(p) : null);
  return grpc.credentials.createSsl(read(tls.ca), read(tls.key), read(tls.cert));
}

/** The gRPC channel options of a session. */
export const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
  "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
  "grpc.keepalive_time_ms": 2000,
  "grpc.keepalive_timeout_ms": 3000,
  "grpc.enable_retries": 0,
  // A fresh connection per session, as a reconnect should.
  "grpc.use_local_subchannel_pool": 1,
};

/** Runs sessions until a stop is requested and the drain is done. */
export async function runLoop(rt: Runtime): Promise<void> {
  const servers = rt.opts.servers;
  let backoff = BACKOFF_MIN_MS;
  let next = 0;
  let redirect: string | null = null;
  for (;;) {
    if (rt.drainDeadline !== null && drainDone(rt, rt.drainDeadline)) break;
    const addr = redirect ?? servers[next++ % servers.length]!;
    redirect = null;
    const welcomed = rt.welcomes;
    const end = await session(rt, addr);
    // After a session that was established, reconnect quickly again: a
    // worker must find a new leader well within its lease.
    if (rt.welcomes !== welcomed) backoff = BACKOFF_MIN_MS;
    if (end.kind === "drained") break;
    if (end.kind === "redirect") {
      rt.log.info("not the leader; following the redirect", { from: addr, to: end.to });
      redirect = end.to;
      backoff = BACKOFF_MIN_MS;
      continue;
    }
    if (end.kind === "refused") rt.log.error("session refused", { server: addr, why: end.why });
    else rt.log.warn("session ended; reconnecting", { server: addr, why: end.why });
    await rt.sleep(backoff * (0.85 + Math.random() * 0.3));
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
  }
  rt.log.info("worker stopped", { worker: rt.opts.workerId });
}

/**
 * The drain's progress, checked between sessions and at every heartbeat:
 * past the deadline stop what is left (reported lost); done when nothing is
 * held and every report is acked, or nothing is held and the acks have had
 * {@link DRAIN_ACK_WAIT_MS} more. Handlers still running then, though
 * stopped, are reported lost and left behind; the drain ends once those
 * reports are written and sent.
 */
export function drainDone(rt: Runtime, deadline: number): boolean {
  const now = rt.now();
  if (now >= deadline) rt.fenceSelf("drain timeout");
  if (now >= deadline + DRAIN_ACK_WAIT_MS) {
    const left = abandonStuck(rt);
    if (left > 0) rt.log.error("drain: handlers still running after being stopped; reported lost and left behind", { attempts: left });
  }
  if (rt.running() === 0 && (rt.unacked() === 0 || now >= deadline + DRAIN_ACK_WAIT_MS)) return true;
  // (Only should writing those reports never end.)
  if (now >= deadline + 2 * DRAIN_ACK_WAIT_MS) {
    rt.log.error("drain: attempts still held; leaving them", { attempts: rt.running() });
    return true;
  }
  return false;
}

/** Logs a failure to handle a message from the leader (never throwing: a logger may). */
function logHandlingError(rt: Runtime, m: ServerMessage, e: unknown): void {
  try {
    rt.log.error("cannot handle a message from the leader; ignored", { message: String(m?.msg), error: describe(e) });
  } catch {
    // a logger that throws: nothing more to do
  }
}

/** One session with the server at `addr`, until it ends. */
export function session(rt: Runtime, addr: string): Promise<SessionEnd> {
  return new Promise<SessionEnd>((resolve) => {
    let finished = false;
    let client: grpc.Client | undefined;
    let call: grpc.ClientDuplexStream<WorkerMessage, ServerMessage> | undefined;
    let ticker: NodeJS.Timeout | undefined;
    let outbound: ((m: WorkerMessage) => void) | null = null;
    const cleanups: Array<() => void> = [];
    const done = (end: SessionEnd) => {
      if (finished) return;
      finished = true;
      if (ticker) clearInterval(ticker);
      for (const f of cleanups) f();
      if (rt.outbound === outbound) rt.outbound = null;
      try {
        call?.cancel();
      } catch {
        // already over
      }
      client?.close();
      resolve(end);
    };
    try {
      const Ctor = workerService();
      client = new Ctor(addr, channelCredentials(rt.opts.tls), CHANNEL_OPTIONS);
    } catch (e) {
      return done({ kind: "lost", why: `connect: ${String(e)}` });
    }
    // The call starts at once (a refused connection fails it with the
    // reason); a connection not up within the connect timeout ends it.
    const connectTimer = setTimeout(() => {
      if (client!.getChannel().getConnectivityState(false) !== grpc.connectivityState.READY) {
        done({ kind: "lost", why: `connect: no connection within ${CONNECT_TIMEOUT_MS} ms` });
      }
    }, CONNECT_TIMEOUT_MS);
    cleanups.push(() => clearTimeout(connectTimer));
    const metadata = new grpc.Metadata();
    if (rt.opts.token) metadata.set("authorization", `Bearer ${rt.opts.token}`);
    const c = (client as unknown as { Session(md: grpc.Metadata): grpc.ClientDuplexStream<WorkerMessage, ServerMessage> }).Session(metadata);
    call = c;
    // The session's lease starts when the leader receives this Hello, so
    // the fence counts from (no later than) its sending.
    const helloSent = rt.now();
    c.write({ hello: rt.hello() });
    let welcomed = false;
    // (A throw in this listener would be an uncaught exception: it is
    // caught, logged, and the session carries on, or ends if it is the
    // Welcome that could not be taken.)
    c.on("data", (m: ServerMessage) => {
      if (finished) return;
      if (welcomed) {
        try {
          rt.handle(m);
        } catch (e) {
          logHandlingError(rt, m, e);
        }
        return;
      }
      if (m.msg === "welcome" && m.welcome) {
        welcomed = true;
        clearTimeout(connectTimer);
        outbound = (msg) => {
          c.write(msg);
        };
        try {
          const hb = welcome(rt, addr, m.welcome, helloSent, outbound, done);
          ticker = setInterval(hb.tick, hb.every);
          hb.tick();
        } catch (e) {
          logHandlingError(rt, m, e);
          done({ kind: "lost", why: `cannot take the Welcome: ${describe(e)}` });
        }
      } else if (m.msg === "not_leader" && m.not_leader) {
        const to = m.not_leader.leader_address;
        done(to === "" || to === addr ? { kind: "lost", why: "no leader yet" } : { kind: "redirect", to });
      } else {
        done({ kind: "lost", why: "the server did not answer Hello" });
      }
    });
    c.on("error", (e: grpc.ServiceError) => done(welcomed ? { kind: "lost", why: `${grpc.status[e.code] ?? e.code}: ${e.details}` } : endOfStatus(e)));
    c.on("end", () => done({ kind: "lost", why: welcomed ? "the server closed the session" : "the server did not answer Hello" }));
  });
}

/** Takes a Welcome (tokens, lease, superseded attempts, the spool re-sent); returns the heartbeat. */
function welcome(
  rt: Runtime,
  addr: string,
  w: Welcome,
  helloSent: number,
  outbound: (m: WorkerMessage) => void,
  done: (end: SessionEnd) => void,
): { tick: () => void; every: number } {
  for (const r of w.superseded) rt.stopAttempt(r.run_id, r.attempt, "abort");
  const leaderToken = BigInt(w.leader_token);
  if (leaderToken > rt.maxToken) rt.maxToken = leaderToken;
  rt.leaseTtlMs = Math.max(Number(w.lease_ttl_ms), 500);
  rt.lastAck = Math.max(rt.lastAck, helloSent);
  rt.heartbeatsSent.clear();
  rt.welcomes++;
  rt.outbound = outbound;
  for (const report of rt.spool.reports()) rt.send({ report });
  rt.log.info("session established", { server: addr, session: w.session_id, token: w.leader_token });
  const every = Math.min(Math.max(Number(w.heartbeat_interval_ms), 50), 2 ** 31 - 1);
  let seq = 0;
  const tick = () => {
    seq++;
    const attempts = [...rt.held.values()].map((h) => ({ run_id: h.runId, attempt: h.attempt }));
    const running = rt.executing();
    const queued = Math.max(0, attempts.length - running);
    rt.heartbeatsSent.set(seq, rt.now());
    const sent = rt.send({
      heartbeat: { seq: String(seq), running, load: running / rt.opts.capacity, attempts, draining: rt.draining, queued },
    });
    if (!sent) return done({ kind: "lost", why: "cannot send on the session" });
    if (rt.drainDeadline !== null && drainDone(rt, rt.drainDeadline)) done({ kind: "drained" });
  };
  return { tick, every };
}
