#!/usr/bin/env node
// A remote activity worker woken by the Kafka dispatch mode's notices (docs/how-to/dispatch.md),
// with kafkajs (npm install kafkajs) and Node's global fetch.
//
// It consumes the activity topic of its queue (<prefix>.activity.<queue>) in a consumer group of
// its own and, on each notice for a name it runs, claims through the HTTP API with
// wait_seconds: 0, then completes or fails the task there. The notice is only a wake-up: the
// claim, its lease and the result all go through the API (examples/remote_worker.js does the
// same with a long poll, and runs the activities with heartbeats; this one keeps to the wake-up).
// A poll every --safety-seconds finds the tasks whose notice was lost.
//
//   node examples/kafka_wakeup_worker.js --url http://127.0.0.1:8765 --bootstrap 127.0.0.1:9092
//        --topic dex.activity.default [--group dex-remote-workers] [--max-tasks N]
"use strict";

const { Kafka, logLevel } = require("kafkajs");

const HANDLERS = {
  "resize-image": async ([image]) => ({
    name: image.name,
    width: Math.round(image.width / 2),
    height: Math.round(image.height / 2),
  }),
};

function options(argv) {
  const found = { url: "http://127.0.0.1:8765", bootstrap: null, topic: null, group: "dex-remote-workers",
    workerId: `kafka-node-${process.pid}`, maxTasks: 0, safetySeconds: 30 };
  for (let i = 2; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (flag === "--url") found.url = value.replace(/\/$/, "");
    else if (flag === "--bootstrap") found.bootstrap = value;
    else if (flag === "--topic") found.topic = value;
    else if (flag === "--group") found.group = value;
    else if (flag === "--worker-id") found.workerId = value;
    else if (flag === "--max-tasks") found.maxTasks = Number(value);
    else if (flag === "--safety-seconds") found.safetySeconds = Number(value);
    else throw new Error(`unknown option ${flag}`);
  }
  if (!found.bootstrap || !found.topic) throw new Error("--bootstrap and --topic are required");
  return found;
}

async function post(url, path, body) {
  const response = await fetch(url + path, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) throw Object.assign(new Error(`${path}: ${response.status}`), { status: response.status });
  return answer;
}

// the activity name of a notice, or null for anything else on the topic
function noticeName(value) {
  try {
    const notice = JSON.parse(value.toString("utf8"));
    return notice && notice.v === 1 && notice.kind === "activity" && typeof notice.name === "string" ? notice.name : null;
  } catch {
    return null;
  }
}

async function claimAndRun(opts) {
  const tasks = await post(opts.url, "/v1/activity-tasks/poll",
    { worker_id: opts.workerId, names: Object.keys(HANDLERS), max: 4, wait_seconds: 0 });
  for (const task of tasks) {
    const path = `/v1/activity-tasks/${task.task_id}`;
    let outcome;
    try {
      const result = await HANDLERS[task.name](task.args);
      await post(opts.url, `${path}/complete`, { lease_version: task.lease_version, result });
      outcome = "completed";
    } catch (error) {
      if (error.status === 409) outcome = "lost";
      else {
        await post(opts.url, `${path}/fail`, { lease_version: task.lease_version,
          error: { type: error.name || "Error", message: String(error.message), terminal: false } });
        outcome = "failed";
      }
    }
    console.log(`task ${task.task_id} ${task.name} attempt ${task.attempt}: ${outcome}`);
  }
  return tasks.length;
}

async function main() {
  const opts = options(process.argv);
  const kafka = new Kafka({ clientId: opts.workerId, brokers: [opts.bootstrap], logLevel: logLevel.ERROR });
  const consumer = kafka.consumer({ groupId: opts.group, sessionTimeout: 6000, heartbeatInterval: 500, maxWaitTimeInMs: 10 });
  await consumer.connect();
  await consumer.subscribe({ topic: opts.topic, fromBeginning: true });
  let done = 0;
  let busy = Promise.resolve();
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const wake = () => {
    busy = busy.then(() => claimAndRun(opts)).then((n) => {
      done += n;
      if (opts.maxTasks && done >= opts.maxTasks) finish();
    }).catch((error) => console.error(`claim: ${error.message}`));
    return busy;
  };
  console.log(`worker ${opts.workerId} woken by ${opts.topic} for ${Object.keys(HANDLERS).join(", ")}`);
  await consumer.run({
    eachMessage: async ({ message }) => {
      if (HANDLERS[noticeName(message.value)]) await wake();
    },
  });
  const safety = setInterval(wake, opts.safetySeconds * 1000);
  for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, finish);
  await finished;
  clearInterval(safety);
  await busy;
  await consumer.disconnect();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
