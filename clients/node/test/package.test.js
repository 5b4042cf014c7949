// The package as a user installs it: importable by its name, with no dependencies at all.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { test } from "node:test";

test("the package imports by its name and depends on nothing", async () => {
  const manifest = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8"));
  for (const field of ["dependencies", "peerDependencies", "optionalDependencies", "devDependencies"]) {
    assert.equal(manifest[field], undefined, field);
  }
  const dex = await import(manifest.name); // resolved through the manifest's "exports"
  assert.deepEqual(Object.keys(dex).sort(), ["ApplicationError", "TerminalError", "Worker", "WorkerCallError", "activityContext"]);
  const types = await readFile(new URL(manifest.exports["."].types, new URL("../", import.meta.url)), "utf8");
  for (const name of Object.keys(dex)) assert.match(types, new RegExp(`export (class|function) ${name}\\b`), name);
});
