#!/usr/bin/env node
// A dex activity worker in JavaScript (Node 18+, no dependencies: the global fetch).
//
// It long-polls POST /v1/activity-tasks/poll for the activity names it knows, runs each task,
// heartbeats while it runs (and stops when the answer says cancel_requested), and reports the
// result or the error. A 409 means the lease is no longer ours (it expired, another worker took
// the task over, or the run ended): whatever we had is dropped, nothing is retried here.
//
//   node examples/remote_worker.js --url http://127.0.0.1:8765 [--token T] [--worker-id ID]
//        [--names resize-image,slow] [--max-tasks N]
//
// Exits after --max-tasks tasks (0: never), or on SIGTERM/SIGINT once the current tasks end.
"use strict";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The activities this worker runs: name -> async (args, task) => result (a JSON value).
// `task.cancelled()` is true once a heartbeat answered cancel_requested (or the lease was lost).
const HANDLERS = {
  "resize-image": async ([image]) => ({
    name: image.name,
    width: Math.round(image.width / 2),
    height: Math.round(image.height / 2),
  }),
  // works for `seconds`, heartbeating; stops early when the run is cancelled
  slow: async ([seconds], task) => {
    const until = Date.now() + seconds * 1000;
    while (Date.now() < until) {
      if (task.cancelled()) return { stopped: "cancelled" };
      await sleep(50);
    }
    return { slept: seconds };
  },
  // fails with an error of its own type; `terminal` stops the retries
  refuse: async ([message, terminal]) => {
    const error = new Error(message);
    error.name = "Refused";
    error.terminal = Boolean(terminal);
    throw error;
  },
  // never returns and never heartbeats (a worker killed here loses its task to the lease)
  hang: async () => new Promise(() => {}),
};

function options(argv) {
  const found = { url: "http://127.0.0.1:8765", workerId: `node-${process.pid}`, names: null, maxTasks: 0, token: null };
  for (let i = 2; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (flag === "--url") found.url = value;
    else if (flag === "--token") found.token = value;
    else if (flag === "--worker-id") found.workerId = value;
    else if (flag === "--names") found.names = value.split(",");
    else if (flag === "--max-tasks") found.maxTasks = Number(value);
    else throw new Error(`unknown option ${flag}`);
  }
  found.names = found.names || Object.keys(HANDLERS);
  return found;
}

class Api {
  constructor(url, token) {
    this.url = url.replace(/\/$/, "");
    this.headers = { "content-type": "application/json" };
    if (token) this.headers.authorization = `Bearer ${token}`;
  }

  // POST a JSON body; the answer's JSON, or an Error carrying the HTTP status and dex's error
  async post(path, body) {
    const response = await fetch(this.url + path, { method: "POST", headers: this.headers, body: JSON.stringify(body) });
    const answer = await response.json();
    if (!response.ok) {
      const error = new Error(`${path}: ${response.status} ${answer.error.type}: ${answer.error.message}`);
      error.status = response.status;
      throw error;
    }
    return answer;
  }
}

async function runTask(api, task) {
  let cancelled = false;
  let beating = true;
  let stopBeating;
  const stopped = new Promise((resolve) => { stopBeating = resolve; });
  const path = `/v1/activity-tasks/${task.task_id}`;
  // heartbeat three times per lease, and at least every second: the answer tells us of a
  // cancellation, which we want to learn soon
  const every = Math.min((task.heartbeat_timeout * 1000) / 3, 1000);
  const beat = (async () => {
    while (beating) {
      await Promise.race([sleep(every), stopped]);
      if (!beating) break;
      try {
        const answer = await api.post(`${path}/heartbeat`, { lease_version: task.lease_version });
        if (answer.cancel_requested) cancelled = true;
      } catch (error) {
        if (error.status === 409) cancelled = true; // the lease is lost: our result would be refused
        else console.error(`heartbeat of task ${task.task_id}: ${error.message}`);
      }
    }
  })();
  const context = { cancelled: () => cancelled, heartbeatNow: async () => {
    const answer = await api.post(`${path}/heartbeat`, { lease_version: task.lease_version });
    cancelled = cancelled || answer.cancel_requested;
    return !cancelled;
  } };
  try {
    const handler = HANDLERS[task.name];
    if (!handler) throw Object.assign(new Error(`no handler for ${task.name}`), { name: "NotRegistered", terminal: true });
    let result;
    try {
      result = await handler(task.args, context);
    } catch (error) {
      if (cancelled) return "cancelled";
      await api.post(`${path}/fail`, {
        lease_version: task.lease_version,
        error: { type: error.name || "Error", message: String(error.message), terminal: Boolean(error.terminal) },
      });
      return "failed";
    }
    if (cancelled) return "cancelled"; // the run is over: nothing to report
    await api.post(`${path}/complete`, { lease_version: task.lease_version, result: result === undefined ? null : result });
    return "completed";
  } catch (error) {
    if (error.status === 409) return "lost"; // another worker has it now, or the run ended
    throw error;
  } finally {
    beating = false;
    stopBeating();
    await beat;
  }
}

async function main() {
  const opts = options(process.argv);
  const api = new Api(opts.url, opts.token);
  let stopping = false;
  let done = 0;
  for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => { stopping = true; });
  console.log(`worker ${opts.workerId} polling ${opts.url} for ${opts.names.join(", ")}`);
  while (!stopping && (opts.maxTasks === 0 || done < opts.maxTasks)) {
    let tasks;
    try {
      tasks = await api.post("/v1/activity-tasks/poll", {
        worker_id: opts.workerId, names: opts.names, max: 4, wait_seconds: 1,
      });
    } catch (error) {
      console.error(`poll: ${error.message}`);
      await sleep(1000); // the server or its store is down: try again shortly
      continue;
    }
    const outcomes = await Promise.all(tasks.map((task) => runTask(api, task).catch((error) => `error: ${error.message}`)));
    for (const [task, outcome] of tasks.map((task, i) => [task, outcomes[i]])) {
      console.log(`task ${task.task_id} ${task.name} attempt ${task.attempt}: ${outcome}`);
    }
    done += tasks.length;
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
