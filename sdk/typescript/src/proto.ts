/**
 * The `gnomon.worker.v1` protocol, loaded at runtime from the copy of
 * `worker.proto` this package ships, and the shapes of its messages as
 * proto-loader decodes them (snake_case fields, 64-bit integers as decimal
 * strings, oneofs named by `msg`).
 *
 * @packageDocumentation
 */
import * as fs from "node:fs";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

/** The protocol version this SDK speaks (`Hello.protocol_version`). */
export const PROTOCOL_VERSION = 1;

/** The largest gRPC message either end sends or accepts: 8 MiB. */
export const MAX_MESSAGE_BYTES = 8 << 20;

/** A 64-bit protobuf integer as this SDK writes it: a decimal string. */
export type U64 = string;

/** An attempt: a run and its attempt number. */
export interface AttemptRef {
  run_id: string;
  attempt: number;
}

/** `Hello`: the first message of a session. */
export interface Hello {
  worker_id: string;
  labels: Record<string, string>;
  capacity: number;
  executors: string[];
  handlers: string[];
  running: AttemptRef[];
  protocol_version: number;
  prefetch: number;
}

/** `Heartbeat`, sent every `Welcome.heartbeat_interval_ms`. */
export interface Heartbeat {
  seq: U64;
  running: number;
  load: number;
  attempts: AttemptRef[];
  draining: boolean;
  queued: number;
}

/** `Started`: an attempt has been running for a moment. */
export interface Started {
  run_id: string;
  attempt: number;
  started_at_ms: number | U64;
}

/** `Outcome` values. */
export const Outcome = {
  UNSPECIFIED: 0,
  SUCCEEDED: 1,
  FAILED: 2,
  TIMED_OUT: 3,
  CANCELLED: 4,
  LOST: 5,
} as const;

/** One of the {@link Outcome} values. */
export type OutcomeValue = (typeof Outcome)[keyof typeof Outcome];

/** `Report`: how an attempt ended. */
export interface Report {
  run_id: string;
  attempt: number;
  outcome: number;
  exit_code?: number;
  http_status?: number;
  output: string;
  started_at_ms: number | U64;
  ended_at_ms: number | U64;
  token: U64;
  no_retry: boolean;
  retry_after_ms: U64;
}

/** `Output`: a piece of a running attempt's live output. */
export interface Output {
  run_id: string;
  attempt: number;
  token: U64;
  offset: U64;
  data: Buffer;
}

/** What a worker sends: exactly one field set. */
export interface WorkerMessage {
  hello?: Hello;
  heartbeat?: Heartbeat;
  started?: Started;
  report?: Report;
  output?: Output;
}

/** `Welcome`: the server leads and accepts the session. */
export interface Welcome {
  session_id: string;
  lease_ttl_ms: U64;
  heartbeat_interval_ms: U64;
  leader_token: U64;
  reclaimed: AttemptRef[];
  superseded: AttemptRef[];
}

/** `NotLeader`: go to `leader_address`, or retry later when it is empty. */
export interface NotLeader {
  leader_address: string;
}

/** `Assign`: run an attempt. */
export interface Assign {
  run_id: string;
  attempt: number;
  token: U64;
  job: string;
  namespace: string;
  scheduled_at_ms: U64;
  executor_json: string;
  timeout_ms: U64;
  idempotency_key: string;
  params_json: string;
  payload: string;
}

/** `Cancel`: stop an attempt and report it cancelled. */
export interface Cancel {
  run_id: string;
  attempt: number;
  token: U64;
}

/** `Abort`: stop a superseded attempt and do not report it. */
export interface Abort {
  run_id: string;
  attempt: number;
  token: U64;
  reason: string;
}

/** `Ack`: of a heartbeat (`heartbeat_seq` set) or of a report (`report` set). */
export interface Ack {
  heartbeat_seq?: U64 | null;
  report?: AttemptRef | null;
  rejected_reason: string;
}

/** What a server sends: `msg` names the field that is set. */
export interface ServerMessage {
  msg?: "welcome" | "not_leader" | "assign" | "cancel" | "ack" | "abort";
  welcome?: Welcome;
  not_leader?: NotLeader;
  assign?: Assign;
  cancel?: Cancel;
  ack?: Ack;
  abort?: Abort;
}

/** The proto-loader options this SDK loads the protocol with. */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: String,
  enums: Number,
  defaults: true,
  oneofs: true,
};

/**
 * Where the package's copy of `worker.proto` is: `proto/` next to the
 * compiled `dist/` (or the test build's `build/src/`).
 */
export function protoPath(): string {
  const rel = path.join("proto", "gnomon", "worker", "v1", "worker.proto");
  for (const up of ["..", path.join("..", "..")]) {
    const candidate = path.resolve(__dirname, up, rel);
    if (fs.existsSync(candidate)) return candidate;
  }
  throw new Error(`gnomon-worker: cannot find ${rel} above ${__dirname}`);
}

/** The constructor of a `gnomon.worker.v1.Worker` client. */
export type WorkerClientConstructor = grpc.ServiceClientConstructor;

let loaded: grpc.GrpcObject | undefined;

/** The loaded `gnomon.worker.v1` package (loaded once). */
export function workerPackage(): grpc.GrpcObject {
  if (!loaded) {
    const def = protoLoader.loadSync(protoPath(), LOADER_OPTIONS);
    loaded = grpc.loadPackageDefinition(def);
  }
  return loaded;
}

/** The `Worker` service's client constructor (its `service` definition too). */
export function workerService(): WorkerClientConstructor {
  const gnomon = workerPackage()["gnomon"] as grpc.GrpcObject;
  const worker = gnomon["worker"] as grpc.GrpcObject;
  const v1 = worker["v1"] as grpc.GrpcObject;
  return v1["Worker"] as WorkerClientConstructor;
}

/** An attempt's key in the worker's maps: `<attempt>:<run_id>`. */
export function keyOf(runId: string, attempt: number): string {
  return `${attempt}:${runId}`;
}
