/**
 * The spool of reports not yet acknowledged by the leader. A report is
 * persisted before it is sent and kept until it is acked; after every
 * Welcome (and after a restart) what is left is sent again. The leader
 * dedupes by (run, attempt).
 *
 * With a directory: one file per report, written to a temporary file,
 * fsync'd, renamed into place (then the directory fsync'd), deleted on ack
 * and loaded at start. Without one: memory only.
 *
 * @packageDocumentation
 */
import * as crypto from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import type { Logger } from "./logger";
import { keyOf, type Report } from "./proto";

/** A report written to the spool (its file, when there is a directory). */
export interface SpoolEntry {
  key: string;
  report: Report;
  file: string | null;
}

const PREFIX = "report-";
const SUFFIX = ".json";

function isReport(v: unknown): v is Report {
  const r = v as Report;
  return typeof r === "object" && r !== null && typeof r.run_id === "string" && Number.isInteger(r.attempt) && Number.isInteger(r.outcome);
}

/** The worker's report spool. */
export class Spool {
  private readonly entries = new Map<string, SpoolEntry>();
  private seq = 0;
  private readonly deleting = new Set<Promise<void>>();

  /**
   * @param dir where report files live; `undefined`: memory only.
   * @param log where write and read failures are logged.
   */
  constructor(
    readonly dir: string | undefined,
    private readonly log: Logger,
  ) {}

  /** Reports persisted and not yet acked. */
  get size(): number {
    return this.entries.size;
  }

  /** Whether a report of this attempt is spooled. */
  has(key: string): boolean {
    return this.entries.has(key);
  }

  /** The spooled report of an attempt. */
  get(key: string): Report | undefined {
    return this.entries.get(key)?.report;
  }

  /** Every spooled report, oldest first. */
  reports(): Report[] {
    return [...this.entries.values()].map((e) => e.report);
  }

  /** Loads the reports a previous process left (none without a directory). Returns how many. */
  async load(): Promise<number> {
    if (!this.dir) return 0;
    try {
      await fs.promises.mkdir(this.dir, { recursive: true });
      const names = (await fs.promises.readdir(this.dir)).sort();
      for (const name of names) {
        const file = path.join(this.dir, name);
        if (name.startsWith(".tmp-")) {
          await fs.promises.rm(file, { force: true });
          continue;
        }
        if (!name.startsWith(PREFIX) || !name.endsWith(SUFFIX)) continue;
        let report: unknown;
        try {
          report = JSON.parse(await fs.promises.readFile(file, "utf8"));
        } catch (e) {
          report = undefined;
          this.log.error("unreadable spooled report; set aside", { file, error: String(e) });
        }
        if (!isReport(report)) {
          await fs.promises.rename(file, file + ".corrupt").catch(() => {});
          continue;
        }
        const key = keyOf(report.run_id, report.attempt);
        const old = this.entries.get(key);
        if (old?.file) await fs.promises.rm(old.file, { force: true });
        this.entries.set(key, { key, report, file });
      }
    } catch (e) {
      this.log.error("cannot read the report spool; reports are kept in memory only", { dir: this.dir, error: String(e) });
    }
    return this.entries.size;
  }

  /**
   * Persists a report (not yet part of the spool: {@link commit} it, or
   * {@link discard} it). A write failure is logged and the report kept in
   * memory only.
   */
  async write(report: Report): Promise<SpoolEntry> {
    const key = keyOf(report.run_id, report.attempt);
    if (!this.dir) return { key, report, file: null };
    const hash = crypto.createHash("sha256").update(key).digest("hex").slice(0, 16);
    const unique = `${Date.now().toString(36)}-${process.pid}-${(this.seq++).toString(36)}`;
    const file = path.join(this.dir, `${PREFIX}${hash}-${unique}${SUFFIX}`);
    const tmp = path.join(this.dir, `.tmp-${hash}-${unique}`);
    try {
      const fh = await fs.promises.open(tmp, "w");
      try {
        await fh.writeFile(JSON.stringify(report));
        await fh.sync();
      } finally {
        await fh.close();
      }
      await fs.promises.rename(tmp, file);
      await syncDir(this.dir);
      return { key, report, file };
    } catch (e) {
      this.log.error("cannot spool report; keeping it in memory", { run: report.run_id, attempt: report.attempt, error: String(e) });
      await fs.promises.rm(tmp, { force: true }).catch(() => {});
      return { key, report, file: null };
    }
  }

  /** Makes a written report part of the spool (replacing any earlier one of the attempt). */
  commit(entry: SpoolEntry): void {
    const old = this.entries.get(entry.key);
    if (old && old.file !== entry.file) this.unlink(old.file);
    this.entries.set(entry.key, entry);
  }

  /** Drops a written report that will not be sent. */
  discard(entry: SpoolEntry): void {
    this.unlink(entry.file);
  }

  /** Forgets an attempt's report (acked, or its attempt aborted), deleting its file. */
  remove(key: string): boolean {
    const entry = this.entries.get(key);
    if (!entry) return false;
    this.entries.delete(key);
    this.unlink(entry.file);
    return true;
  }

  /** Waits for the deletions under way. */
  async settle(): Promise<void> {
    while (this.deleting.size > 0) await Promise.all([...this.deleting]);
  }

  private unlink(file: string | null): void {
    if (!file) return;
    const p: Promise<void> = fs.promises
      .rm(file, { force: true })
      .catch((e) => this.log.warn("cannot delete spooled report", { file, error: String(e) }))
      .finally(() => this.deleting.delete(p));
    this.deleting.add(p);
  }
}

async function syncDir(dir: string): Promise<void> {
  let fh: fs.promises.FileHandle | undefined;
  try {
    fh = await fs.promises.open(dir, "r");
    await fh.sync();
  } catch {
    // Not supported everywhere (Windows); the rename itself is atomic.
  } finally {
    await fh?.close().catch(() => {});
  }
}
