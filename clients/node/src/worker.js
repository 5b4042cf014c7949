// The worker: activities registered by name, and a loop that long-polls for them within a
// concurrency limit, runs each claimed task (attempt.js), and drains on SIGTERM or SIGINT.
//
// Each poll asks for as many tasks as there are free places, so the worker never holds more
// than `concurrency`. A poll that fails (no answer, 5xx, 503, a refusal) is made again after a
// growing pause (0.5 s doubling to 30 s, or the server's Retry-After), never at once. stop() (or
// a signal) stops the polling: the poll in flight returns, what it claimed runs, and run()
// resolves once every task is reported.

import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { ActivityTaskClient, Backoff } from "./client.js";
import { claimedTask, runAttempt } from "./attempt.js";

const MAX_TEXT = 1000; // characters of an activity name or a worker id, as the server takes them
const MAX_NAMES = 100;
const MAX_CLAIM = 100;
const MAX_WAIT_SECONDS = 60;

const quietLogger = {
  info: () => {},
  warn: (message) => console.error(`dex worker: ${message}`),
  error: (message) => console.error(`dex worker: ${message}`),
};

export class Worker {
  /**
   * @param {object} options
   * @param {string} options.url the dex server (`dex web`), e.g. http://127.0.0.1:8765
   * @param {string} [options.token] its bearer token (`dex web --token`)
   * @param {number} [options.concurrency=8] the most tasks run at once
   * @param {string} [options.workerId] names this worker in leases (node-HOST-PID by default)
   * @param {number} [options.pollWaitSeconds=10] how long one poll waits for work (a stop waits for it)
   * @param {number} [options.maxHeartbeatInterval=2] the longest pause between a task's heartbeats, in seconds
   * @param {object} [options.logger] {info, warn, error}; by default warnings and errors go to stderr
   */
  constructor({ url, token = null, concurrency = 8, workerId = null, pollWaitSeconds = 10, maxHeartbeatInterval = 2, logger = quietLogger } = {}) {
    if (typeof url !== "string" || !/^https?:\/\//.test(url) || !wellFormed(url)) throw new TypeError(`url must be an http:// or https:// URL, got ${String(url)}`);
    if (token !== null && (typeof token !== "string" || !/^[\x21-\x7e]+$/.test(token))) {
      throw new TypeError("token must be a non-empty string of printable ASCII without spaces");
    }
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new RangeError(`concurrency must be a positive integer, got ${concurrency}`);
    if (typeof pollWaitSeconds !== "number" || !(pollWaitSeconds >= 0 && pollWaitSeconds <= MAX_WAIT_SECONDS)) {
      throw new RangeError(`pollWaitSeconds must be between 0 and ${MAX_WAIT_SECONDS}, got ${pollWaitSeconds}`);
    }
    if (typeof maxHeartbeatInterval !== "number" || !(maxHeartbeatInterval > 0 && Number.isFinite(maxHeartbeatInterval))) {
      throw new RangeError(`maxHeartbeatInterval must be a positive number of seconds, got ${maxHeartbeatInterval}`);
    }
    this.workerId = checkedText(workerId ?? `node-${hostname()}-${process.pid}`, "workerId");
    this.concurrency = concurrency;
    this.client = new ActivityTaskClient(url, token);
    this.pollWaitSeconds = pollWaitSeconds;
    this.maxHeartbeatInterval = maxHeartbeatInterval;
    this.logger = logger;
    this.functions = new Map();
    this.inFlight = new Set();
    this.stopping = null; // an AbortController while run() runs: aborted by stop()
  }

  /** Register `fn` (sync or async) as the activity `name`. It is called with the workflow's
   * arguments (JSON values) and returns a JSON value; throw an ApplicationError ({terminal,
   * retryAfter}) or a TerminalError to steer the retries (any error with `terminal: true` is
   * final too). activityContext() inside it gives the task and an AbortSignal that fires once
   * the run was cancelled or ended, or the lease was lost. Returns the worker. */
  register(name, fn) {
    checkedText(name, "the activity name");
    if (typeof fn !== "function") throw new TypeError(`activity ${JSON.stringify(name)} must be a function`);
    if (this.functions.has(name)) throw new Error(`activity ${JSON.stringify(name)} is registered already`);
    if (this.functions.size >= MAX_NAMES) throw new RangeError(`a worker runs at most ${MAX_NAMES} activity names`);
    this.functions.set(name, fn);
    return this;
  }

  /** Stop polling; run() resolves once the tasks in flight are reported. */
  stop() {
    this.stopping?.abort();
  }

  /** Poll and run tasks until stop(), SIGTERM or SIGINT (`handleSignals`); then finish the tasks
   * in flight and resolve, so a script ending with `await worker.run()` exits 0. */
  async run({ handleSignals = true } = {}) {
    if (this.functions.size === 0) throw new Error("no activity is registered: call worker.register(name, fn)");
    if (this.stopping) throw new Error("this worker is running already");
    this.stopping = new AbortController();
    const onSignal = () => this.stop();
    const signals = handleSignals ? ["SIGTERM", "SIGINT"] : [];
    for (const signal of signals) process.on(signal, onSignal);
    try {
      this.logger.info(`worker ${this.workerId} polling for ${[...this.functions.keys()].join(", ")}`);
      await this.pollUntilStopped(this.stopping.signal);
    } finally {
      if (this.inFlight.size) this.logger.info(`worker ${this.workerId} stopping: finishing ${this.inFlight.size} tasks`);
      await Promise.all(this.inFlight);
      for (const signal of signals) process.off(signal, onSignal);
      this.stopping = null;
    }
  }

  async pollUntilStopped(stopped) {
    const backoff = new Backoff();
    const names = [...this.functions.keys()];
    const whenStopped = new Promise((resolve) => stopped.addEventListener("abort", resolve, { once: true }));
    while (!stopped.aborted) {
      const free = this.concurrency - this.inFlight.size;
      if (free <= 0) {
        await Promise.race([...this.inFlight, whenStopped]);
        continue;
      }
      let tasks;
      try {
        tasks = await this.client.poll(this.workerId, names, Math.min(free, MAX_CLAIM), this.pollWaitSeconds);
      } catch (error) {
        const pause = backoff.nextPause(error.retryAfter ?? null);
        this.logger.warn(`poll failed (${error.message}); polling again in ${pause.toFixed(1)} s`);
        await sleep(pause * 1000, undefined, { signal: stopped }).catch(() => {});
        continue;
      }
      backoff.reset();
      for (const entry of tasks) this.start(entry);
    }
  }

  start(entry) {
    const task = claimedTask(entry);
    if (!task) {
      this.logger.error(`the poll answered a task that cannot be run: ${JSON.stringify(entry)?.slice(0, 200)}`);
      return;
    }
    const fn = this.functions.get(task.name);
    if (!fn) {
      this.logger.error(`task ${task.task_id} names activity ${JSON.stringify(task.name)}, which this worker does not run`);
      return;
    }
    const attempt = runAttempt({
      client: this.client,
      task,
      fn,
      workerId: this.workerId,
      maxHeartbeatInterval: this.maxHeartbeatInterval,
      logger: this.logger,
    }).then((outcome) => {
      this.logger.info(`task ${task.task_id} ${task.name} attempt ${task.attempt}: ${outcome}`);
      this.inFlight.delete(attempt);
      return outcome;
    });
    this.inFlight.add(attempt);
  }
}

function checkedText(value, what) {
  if (typeof value !== "string") throw new TypeError(`${what} must be a string, got ${typeof value}`);
  if (!value || value.length > MAX_TEXT) throw new RangeError(`${what} must hold 1 to ${MAX_TEXT} characters`);
  if (value.includes("\0") || !wellFormed(value)) throw new RangeError(`${what} must not hold a NUL or a lone surrogate`);
  return value;
}

function wellFormed(text) {
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(text);
}
