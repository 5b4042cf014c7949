// What a worker must survive: hostile values and thrown things (against the real `dex web`), and
// a server that fails, refuses or is gone (a scripted node:http server): each its own task's
// error or a retry after a growing pause, never a hot loop; a healthy task completes afterwards.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createServer as createTcpServer } from "node:net";
import { once } from "node:events";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "../src/index.js";
import { ended, healthy, recorder, running, skip, start, worker } from "../test-support/dex.js";

test("bad options and names are refused at the call", () => {
  const url = "http://127.0.0.1:9";
  assert.throws(() => new Worker({ url, workerId: "w\0" }), /NUL or a lone surrogate/);
  assert.throws(() => new Worker({ url, workerId: "w\ud800" }), /NUL or a lone surrogate/);
  assert.throws(() => new Worker({ url, token: "to ken" }), /token/);
  assert.throws(() => new Worker({ url, concurrency: 0 }), /concurrency/);
  assert.throws(() => new Worker({ url: "ftp://x" }), /url/);
  const w = new Worker({ url });
  for (const name of ["a\0b", "a\udc80b", ""]) assert.throws(() => w.register(name, () => 1));
  assert.throws(() => w.register("x", "not a function"), /function/);
  assert.rejects(() => w.run(), /no activity/);
});

test("hostile payloads and thrown things fail their own task only", { skip }, async () => {
  const w = worker()
    .register("echo", (value) => value)
    .register("surrogate", () => "lone \ud800 here")
    .register("bigint", () => ({ n: 1n }))
    .register("big", () => "x".repeat(3_000_000)) // over the 2 MiB payload limit
    .register("loud", () => {
      throw new Error("nul \0 and lone \udfff in a message");
    })
    .register("unprintable", () => {
      throw {
        get name() {
          throw new Error("no name");
        },
        get message() {
          throw new Error("no message");
        },
      };
    })
    .register("string", () => {
      throw "a bare string";
    })
    .register("null", () => {
      throw null;
    })
    .register("huge", () => {
      throw new Error("x".repeat(3_000_000));
    });
  await running(w, async () => {
    const nul = { "k\0ey": ["v\0lue", "\0"] };
    const echoed = await ended(await start("echo", [nul]));
    assert.deepEqual([echoed.status, echoed.result], ["COMPLETED", nul]);
    for (const [name, type, message, terminal] of [
      ["surrogate", "InvalidValue", /lone surrogate|not valid Unicode/, true],
      ["bigint", "SerializationError", /no JSON form/, true],
      ["big", "InvalidValue", /exceeds the limit/, true],
      ["loud", "Error", /^nul \0 and lone \\udfff in a message$/, false],
      ["unprintable", "Error", /^$/, false],
      ["string", "thrown string", /^a bare string$/, false],
      ["null", "thrown object", /^null$/, false],
      ["huge", "Error", /truncated: 3000000 characters/, false],
    ]) {
      const run = await ended(await start(name, [], 2));
      assert.equal(run.status, "FAILED", name);
      let failure = run.failure;
      while (failure.cause) failure = failure.cause; // the activity's own failure, under the workflow's
      assert.equal(failure.type, type, name);
      assert.match(failure.message, message, name);
      assert.equal(failure.terminal, terminal, name);
    }
  });
  await healthy(assert);
});

// A scripted server: answers each call by `script(path, body)` -> [status, body, headers], and
// notes when each call came.
async function scripted(script) {
  const calls = [];
  const server = createServer(async (request, response) => {
    let body = "";
    for await (const chunk of request) body += chunk;
    calls.push({ path: request.url, at: Date.now(), body: JSON.parse(body || "null") });
    const [status, answer, headers = {}] = script(request.url, calls);
    response.writeHead(status, { "content-type": "application/json", ...headers });
    response.end(JSON.stringify(answer));
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return { url: `http://127.0.0.1:${server.address().port}`, calls, close: () => server.close() };
}

const TASK = { task_id: 7, run_id: "r", name: "echo", attempt: 1, args: ["hi"], lease_version: 42, lease_until: "", heartbeat_timeout: 30 };
const down = [500, { error: { type: "InternalError", message: "store down" } }];

test("failed polls and reports are retried after growing pauses", async () => {
  let polls = 0;
  let completes = 0;
  const server = await scripted((path) => {
    if (path.endsWith("/poll")) {
      polls += 1;
      if (polls === 1) return down;
      if (polls === 2) return [503, { error: { type: "Unavailable", message: "too many polls" } }, { "retry-after": "1" }];
      if (polls === 3) return down;
      return [200, polls === 4 ? [TASK] : []];
    }
    if (path.endsWith("/complete")) return ++completes <= 2 ? down : [200, {}];
    return [200, { cancel_requested: false }];
  });
  const w = new Worker({ url: server.url, pollWaitSeconds: 0, logger: recorder() }).register("echo", (v) => v);
  try {
    await running(w, async () => {
      while (completes < 3) await sleep(20);
    });
  } finally {
    server.close();
  }
  const at = (suffix) => server.calls.filter((c) => c.path.endsWith(suffix)).map((c) => c.at);
  const [p0, p1, p2, p3] = at("/poll");
  assert.ok(p1 - p0 >= 240, `a 500: half of 0.5 s at least, got ${p1 - p0}`);
  assert.ok(p2 - p1 >= 950, `the 503's Retry-After: 1, got ${p2 - p1}`);
  assert.ok(p3 - p2 >= 490, `then the pause doubles, got ${p3 - p2}`);
  const [c0, c1, c2] = at("/complete");
  assert.ok(c1 - c0 >= 240 && c2 - c1 >= 490, `${c1 - c0}, ${c2 - c1}`);
  const last = server.calls.filter((c) => c.path.endsWith("/complete")).at(-1).body;
  assert.deepEqual(last, { lease_version: 42, worker_id: w.workerId, result: "hi" });
});

test("a server that is gone or refuses the token is polled ever more slowly", async () => {
  const gone = recorder();
  const w = new Worker({ url: "http://127.0.0.1:9", pollWaitSeconds: 0, logger: gone }).register("echo", (v) => v);
  await running(w, () => sleep(2500));
  assert.ok(gone.lines.length >= 2 && gone.lines.length <= 5, gone.lines.join("\n"));
  const server = await scripted(() => [401, { error: { type: "Unauthorized", message: "a token is needed" } }]);
  const refused = recorder();
  const w2 = new Worker({ url: server.url, token: "wrong", pollWaitSeconds: 0, logger: refused }).register("echo", (v) => v);
  try {
    await running(w2, () => sleep(2000));
  } finally {
    server.close();
  }
  assert.ok(server.calls.length >= 2 && server.calls.length <= 4, `${server.calls.length} polls in 2 s`);
  assert.match(refused.lines[0], /401 Unauthorized/);
});

test("a cut or broken answer is a failed poll, polled again after the growing pause", async () => {
  const answers = [
    "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[", // cut short
    'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"a": 1}', // JSON, but not a list of tasks
    "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\n<html", // a proxy's page
    "NOT HTTP AT ALL\r\n\r\n",
  ];
  const seen = [];
  const server = createTcpServer((socket) => {
    socket.once("data", () => {
      socket.end(answers[Math.min(seen.length, answers.length - 1)]);
      seen.push(Date.now());
    });
    socket.on("error", () => {});
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const log = recorder();
  const w = new Worker({ url: `http://127.0.0.1:${server.address().port}`, pollWaitSeconds: 0, logger: log });
  w.register("echo", (v) => v);
  try {
    await running(w, () => sleep(4000));
  } finally {
    server.close();
  }
  assert.ok(log.lines.length >= 3 && log.lines.length <= 5, log.lines.join("\n"));
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i] - seen[i - 1] >= 240, `${seen[i] - seen[i - 1]} ms apart`);
});
