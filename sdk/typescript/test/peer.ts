// A scripted test peer: an in-process gRPC server implementing the Worker
// service, recording what a worker sends and sending what a test says.
import * as grpc from "@grpc/grpc-js";
import { workerService, type ServerMessage, type Welcome, type WorkerMessage, type Hello } from "../src/proto";

/** What the peer answers a Hello with. */
export type HelloAnswer = { welcome: Partial<Welcome> } | { notLeader: string } | { status: grpc.status; details: string } | { silence: true };

export class PeerSession {
  readonly messages: WorkerMessage[] = [];
  hello: Hello | undefined;
  ended = false;
  metadata: grpc.Metadata;
  seq = 0;
  constructor(
    readonly peer: Peer,
    readonly call: grpc.ServerDuplexStream<WorkerMessage, ServerMessage>,
  ) {
    this.metadata = call.metadata;
  }
  send(m: ServerMessage): void {
    if (!this.ended) this.call.write(m);
  }
  /** Ends the session with a status (default: OK). */
  end(code = grpc.status.OK, details = "bye"): void {
    if (this.ended) return;
    this.ended = true;
    if (code === grpc.status.OK) this.call.end();
    else this.call.emit("error", { code, details });
  }
  of<K extends keyof WorkerMessage>(kind: K): NonNullable<WorkerMessage[K]>[] {
    return this.messages.filter((m) => m[kind] !== undefined && m[kind] !== null).map((m) => m[kind]!) as NonNullable<WorkerMessage[K]>[];
  }
}

export interface PeerOptions {
  /** Decides the answer to each Hello (default: welcome with `welcome`). */
  answer?: (hello: Hello, index: number) => HelloAnswer;
  welcome?: Partial<Welcome>;
}

export class Peer {
  readonly sessions: PeerSession[] = [];
  /** Every message received, in order, with its session index. */
  readonly log: Array<{ session: number; msg: WorkerMessage }> = [];
  ackHeartbeats = true;
  ackReports = true;
  /** Delays heartbeat acks by this many ms (0: at once). */
  ackDelayMs = 0;
  answer: (hello: Hello, index: number) => HelloAnswer;
  welcome: Partial<Welcome>;
  private server = new grpc.Server();
  port = 0;

  constructor(opts: PeerOptions = {}) {
    this.welcome = opts.welcome ?? {};
    this.answer = opts.answer ?? (() => ({ welcome: this.welcome }));
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(port = 0, creds: grpc.ServerCredentials = grpc.ServerCredentials.createInsecure()): Promise<this> {
    this.server.addService(workerService().service, {
      Session: (call: grpc.ServerDuplexStream<WorkerMessage, ServerMessage>) => this.onSession(call),
    });
    this.port = await new Promise<number>((resolve, reject) =>
      this.server.bindAsync(`127.0.0.1:${port}`, creds, (err, p) => (err ? reject(err) : resolve(p))),
    );
    return this;
  }

  private onSession(call: grpc.ServerDuplexStream<WorkerMessage, ServerMessage>): void {
    const s = new PeerSession(this, call);
    const index = this.sessions.length;
    this.sessions.push(s);
    call.on("data", (m: WorkerMessage) => {
      if (s.ended) return;
      s.messages.push(m);
      this.log.push({ session: index, msg: m });
      if (m.hello) {
        s.hello = m.hello;
        const a = this.answer(m.hello, index);
        if ("welcome" in a) {
          s.send({
            welcome: {
              session_id: `s${index}`,
              lease_ttl_ms: "10000",
              heartbeat_interval_ms: "50",
              leader_token: "1",
              reclaimed: [],
              superseded: [],
              ...a.welcome,
            },
          });
        } else if ("notLeader" in a) {
          s.send({ not_leader: { leader_address: a.notLeader } });
          s.end();
        } else if ("status" in a) {
          s.end(a.status, a.details);
        }
      } else if (m.heartbeat && this.ackHeartbeats) {
        const seq = m.heartbeat.seq;
        const ack = () => s.send({ ack: { heartbeat_seq: seq, rejected_reason: "" } });
        if (this.ackDelayMs > 0) setTimeout(ack, this.ackDelayMs);
        else ack();
      } else if (m.report && this.ackReports) {
        s.send({ ack: { report: { run_id: m.report.run_id, attempt: m.report.attempt }, rejected_reason: "" } });
      }
    });
    call.on("error", () => {
      s.ended = true;
    });
    call.on("end", () => {
      s.ended = true;
      try {
        call.end();
      } catch {
        // already ended
      }
    });
    call.on("cancelled", () => {
      s.ended = true;
    });
  }

  /** The newest session. */
  get current(): PeerSession {
    const s = this.sessions[this.sessions.length - 1];
    if (!s) throw new Error("no session yet");
    return s;
  }

  /** Every message of a kind, over all sessions. */
  all<K extends keyof WorkerMessage>(kind: K): NonNullable<WorkerMessage[K]>[] {
    return this.log.filter((e) => e.msg[kind] != null).map((e) => e.msg[kind]!) as NonNullable<WorkerMessage[K]>[];
  }

  /** Reports received for a run (all sessions). */
  reports(runId?: string) {
    return this.all("report").filter((r) => runId === undefined || r.run_id === runId);
  }

  async stop(): Promise<void> {
    for (const s of this.sessions) s.end(grpc.status.UNAVAILABLE, "peer stopping");
    await new Promise<void>((resolve) => this.server.tryShutdown(() => resolve()));
    this.server.forceShutdown();
  }
}

/** Waits until `cond()` holds, polling every 5 ms; fails after `timeoutMs`. */
export async function until(what: string, cond: () => boolean, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

let runCounter = 0;
/** An Assign of handler `name` with a fresh run id. */
export function assign(name: string, extra: Partial<import("../src/proto").Assign> = {}, payload?: unknown): import("../src/proto").Assign {
  runCounter++;
  return {
    run_id: `run-${runCounter}`,
    attempt: 1,
    token: "1",
    job: "job",
    namespace: "default",
    scheduled_at_ms: "1700000000000",
    executor_json: JSON.stringify({ handler: payload === undefined ? { name } : { name, payload } }),
    timeout_ms: "0",
    idempotency_key: `key-${runCounter}`,
    params_json: "",
    payload: "",
    ...extra,
  };
}
