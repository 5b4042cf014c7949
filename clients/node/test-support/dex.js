// What the tests share: the dex server under test (DEX_URL, DEX_TOKEN: a real `dex web` whose
// engine registers the workflow "sdk-call"), runs started and awaited through its /v1 API, and a
// worker run for the length of a block.
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "../src/index.js";

export const DEX_URL = process.env.DEX_URL;
export const TOKEN = process.env.DEX_TOKEN || null;
export const skip = DEX_URL ? false : "DEX_URL is not set: run through tests/remote/test_sdk_node.py";

async function api(method, path, body) {
  const headers = { "content-type": "application/json" };
  if (TOKEN) headers.authorization = `Bearer ${TOKEN}`;
  const response = await fetch(DEX_URL + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${JSON.stringify(answer)}`);
  return answer;
}

/** Start a run of "sdk-call": the activity `name` called with `args`, up to `maxAttempts` times. */
export async function start(name, args, maxAttempts = 3) {
  const { run_id } = await api("POST", "/v1/runs", { workflow: "sdk-call", args: [name, args, maxAttempts] });
  return run_id;
}

export const getRun = (runId) => api("GET", `/v1/runs/${runId}`);
export const cancel = (runId) => api("POST", `/v1/runs/${runId}/cancel`, {});

/** The run once it ended (COMPLETED, FAILED or CANCELLED), within `seconds`. */
export async function ended(runId, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const run = await getRun(runId);
    if (["COMPLETED", "FAILED", "CANCELLED"].includes(run.status)) return run;
    if (Date.now() > deadline) throw new Error(`run ${runId} is still ${run.status}`);
    await sleep(50);
  }
}

export function worker(options = {}) {
  return new Worker({ url: DEX_URL, token: TOKEN, pollWaitSeconds: 1, maxHeartbeatInterval: 0.3, ...options });
}

/** `body(worker)` while `worker` runs; then it is stopped and drained. */
export async function running(w, body) {
  const run = w.run({ handleSignals: false });
  try {
    return await body(w);
  } finally {
    w.stop();
    await run;
  }
}

/** A recording logger, for the tests that count failed calls. */
export function recorder() {
  const lines = [];
  return { lines, info: () => {}, warn: (m) => lines.push(m), error: (m) => lines.push(m) };
}

/** A healthy task after the poison: it completes. */
export async function healthy(assert) {
  const w = worker({ workerId: "healthy" }).register("echo", (value) => value);
  await running(w, async () => {
    const run = await ended(await start("echo", [{ ok: [1, 2.5, null, true] }]));
    assert.deepEqual([run.status, run.result], ["COMPLETED", { ok: [1, 2.5, null, true] }]);
  });
}
