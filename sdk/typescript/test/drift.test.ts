// The package's copy of the protocol must match the canonical one.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { protoPath } from "../src/proto";

const REL = path.join("proto", "gnomon", "worker", "v1", "worker.proto");

test("proto/ is the canonical worker.proto (run scripts/sync-proto.sh after changing it)", (t) => {
  const pkg = path.resolve(__dirname, "..", "..");
  const ours = path.join(pkg, REL);
  const canonical = path.resolve(pkg, "..", "..", "crates", "gnomon-proto", REL);
  if (!fs.existsSync(canonical)) {
    t.skip(`no canonical proto at ${canonical} (not in the gnomon repository)`);
    return;
  }
  const a = fs.readFileSync(ours, "utf8");
  const b = fs.readFileSync(canonical, "utf8");
  assert.ok(a === b, `${ours} differs from ${canonical}: run sdk/typescript/scripts/sync-proto.sh`);
  assert.equal(protoPath(), ours, "the copy loaded at runtime is the package's");
});
