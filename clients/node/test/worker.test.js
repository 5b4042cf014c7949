// The Node worker against a real `dex web` (DEX_URL, DEX_TOKEN): results, failures, heartbeats,
// cancellation, the concurrency limit and drain on SIGTERM.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { ApplicationError, TerminalError, activityContext } from "../src/index.js";
import { DEX_URL, TOKEN, cancel, ended, getRun, healthy, running, skip, start, worker } from "../test-support/dex.js";

test("results and retryable and terminal failures reach the workflow", { skip }, async () => {
  const attempts = new Map();
  const w = worker()
    .register("echo", (value) => value)
    .register("flaky", async (key) => {
      attempts.set(key, (attempts.get(key) || 0) + 1);
      if (attempts.get(key) < 3) throw new Error(`try ${attempts.get(key)}`);
      return `${key} after ${attempts.get(key)}`;
    })
    .register("refuse", (message) => {
      throw new TerminalError(message);
    })
    .register("marked", () => {
      throw Object.assign(new RangeError("marked final"), { terminal: true });
    })
    .register("always", () => {
      throw new TypeError("never works");
    });
  await running(w, async () => {
    const flaky = await ended(await start("flaky", ["a"]));
    assert.deepEqual([flaky.status, flaky.result], ["COMPLETED", "a after 3"]);
    const refused = await ended(await start("refuse", ["no such image"]));
    assert.equal(refused.status, "FAILED");
    assert.match(JSON.stringify(refused.failure), /TerminalError.*no such image/);
    const marked = await ended(await start("marked", []));
    assert.match(JSON.stringify(marked.failure), /RangeError.*marked final/);
    const spent = await ended(await start("always", [], 2));
    assert.match(JSON.stringify(spent.failure), /TypeError.*never works/);
  });
  assert.equal(attempts.get("a"), 3);
});

test("retryAfter replaces the policy's delay", { skip }, async () => {
  const times = [];
  const w = worker().register("later", () => {
    times.push(Date.now());
    if (times.length === 1) throw new ApplicationError("busy", { retryAfter: 1 });
    return "done";
  });
  await running(w, async () => {
    const run = await ended(await start("later", []));
    assert.deepEqual([run.status, run.result], ["COMPLETED", "done"]);
  });
  assert.ok(times[1] - times[0] >= 950, `retried after ${times[1] - times[0]} ms`); // the policy: 10 ms
});

test("heartbeats keep a task longer than its lease", { skip }, async () => {
  const attempts = [];
  const w = worker({ maxHeartbeatInterval: 10 }).register("long", async (seconds) => {
    attempts.push(activityContext().attempt);
    await sleep(seconds * 1000);
    return "kept";
  });
  await running(w, async () => {
    const run = await ended(await start("long", [4])); // the server's lease is 1.5 s
    assert.deepEqual([run.status, run.result], ["COMPLETED", "kept"]);
  });
  assert.deepEqual(attempts, [1]);
});

test("cancellation aborts the activity's signal", { skip }, async () => {
  let told = null;
  let started;
  const begun = new Promise((resolve) => (started = resolve));
  const w = worker().register("watch", async () => {
    const context = activityContext();
    started();
    await new Promise((resolve) => context.signal.addEventListener("abort", resolve, { once: true }));
    told = { at: Date.now(), cancelRequested: context.cancelRequested, alive: await context.heartbeat() };
    return "finished anyway"; // not reported: the run is over
  });
  await running(w, async () => {
    const runId = await start("watch", []);
    await begun;
    const cancelledAt = Date.now();
    await cancel(runId);
    const run = await ended(runId);
    assert.equal(run.status, "CANCELLED");
    while (!told) await sleep(20);
    assert.ok(told.at - cancelledAt < 5000);
    assert.deepEqual([told.cancelRequested, told.alive], [true, false]);
  });
  await healthy(assert);
});

test("concurrency limits the tasks held at once", { skip }, async () => {
  let now = 0;
  let most = 0;
  const w = worker({ concurrency: 2 }).register("busy", async (i) => {
    most = Math.max(most, ++now);
    await sleep(400);
    now -= 1;
    return i;
  });
  await running(w, async () => {
    const runs = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => start("busy", [i])));
    const results = await Promise.all(runs.map((r) => ended(r)));
    assert.deepEqual(results.map((r) => r.result), [0, 1, 2, 3, 4, 5]);
  });
  assert.equal(most, 2);
});

for (const signal of ["SIGTERM", "SIGINT"]) {
  test(`${signal} stops polling, finishes the task in flight and exits 0`, { skip }, async () => {
    const script = fileURLToPath(new URL("../test-support/drain-worker.js", import.meta.url));
    const child = spawn(process.execPath, [script], { env: { ...process.env, DEX_URL, DEX_TOKEN: TOKEN || "" } });
    let output = "";
    child.stdout.on("data", (chunk) => (output += chunk));
    child.stderr.on("data", (chunk) => (output += chunk));
    try {
      const first = await start("sdk-slow", [2]);
      const deadline = Date.now() + 30_000;
      while (!output.includes("started")) {
        assert.ok(Date.now() < deadline && child.exitCode === null, `the task never started: ${output}`);
        await sleep(20);
      }
      child.kill(signal);
      await sleep(200);
      const second = await start("sdk-slow", [0]);
      const [code] = await once(child, "exit");
      assert.equal(code, 0, output);
      assert.match(output, /drained/);
      const run = await ended(first, 10);
      assert.deepEqual([run.status, run.result], ["COMPLETED", { slept: 2 }]);
      await sleep(500);
      assert.equal((await getRun(second)).status, "RUNNING"); // nothing was claimed after the signal
      const w = worker().register("sdk-slow", (seconds) => ({ slept: seconds }));
      await running(w, async () => assert.equal((await ended(second)).status, "COMPLETED"));
    } finally {
      child.kill("SIGKILL");
    }
  });
}
