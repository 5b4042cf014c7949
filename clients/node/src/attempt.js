// One claimed task run to its end: the function called, its lease kept by heartbeats, its
// cancellation told through an AbortSignal, its result or failure reported.
//
// Heartbeats come every third of the task's heartbeat_timeout (at most every
// maxHeartbeatInterval seconds, so a cancellation is learnt soon) until the outcome is reported.
// A heartbeat answered cancel_requested, or 409 (the lease is lost), aborts the attempt's
// signal: activityContext().signal fires, the worker stops waiting for the function, and
// nothing it returns is reported (the server would refuse it). A report that got no answer (no
// connection, 5xx, 503) is sent again after a growing pause while the lease may still be held.

import { AsyncLocalStorage } from "node:async_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import { Backoff } from "./client.js";

const storage = new AsyncLocalStorage();

/** The context of the activity running here: {taskId, runId, name, attempt, signal,
 * cancelRequested, heartbeat()}. Throws outside an activity. */
export function activityContext() {
  const context = storage.getStore();
  if (!context) throw new Error("activityContext() is only available inside a running activity");
  return context;
}

/** A task of a poll's answer, checked: null when it lacks what the API promises. */
export function claimedTask(entry) {
  if (!entry || typeof entry !== "object") return null;
  const { task_id, lease_version, heartbeat_timeout, args, name } = entry;
  const usable =
    Number.isSafeInteger(task_id) &&
    Number.isSafeInteger(lease_version) &&
    typeof heartbeat_timeout === "number" &&
    heartbeat_timeout > 0 &&
    Array.isArray(args) &&
    typeof name === "string";
  return usable ? entry : null;
}

/** Run `fn` for `task` and report its outcome; resolves to how it ended: completed, failed,
 * cancelled, lost (409) or abandoned (no report got through before the lease lapsed). Never
 * rejects. */
export async function runAttempt({ client, task, fn, workerId, maxHeartbeatInterval, logger }) {
  const controller = new AbortController();
  let renewedAt = Date.now();
  const cancel = (reason) => {
    if (!controller.signal.aborted) controller.abort(reason);
  };
  const beat = async () => {
    try {
      const cancelRequested = await client.heartbeat(task, workerId);
      renewedAt = Date.now();
      if (cancelRequested) cancel(new Error("the run was cancelled or ended"));
    } catch (error) {
      if (error.leaseLost) cancel(new Error("the task's lease is lost"));
      else logger.warn(`task ${task.task_id}: heartbeat failed: ${error.message}`);
    }
    return !controller.signal.aborted;
  };
  const every = Math.min(task.heartbeat_timeout / 3, maxHeartbeatInterval) * 1000;
  let beating = true;
  let timer = null;
  const schedule = () => {
    timer = setTimeout(async () => {
      await beat();
      if (beating) schedule();
    }, every);
  };
  schedule();
  const context = {
    taskId: task.task_id,
    runId: task.run_id,
    name: task.name,
    attempt: task.attempt,
    signal: controller.signal,
    get cancelRequested() {
      return controller.signal.aborted;
    },
    heartbeat: beat,
  };

  try {
    const outcome = await called(fn, task.args, context, controller.signal);
    if (controller.signal.aborted) return "cancelled";
    if (outcome.failure) return await report(() => client.fail(task, workerId, outcome.failure), "failed");
    let resultJson;
    try {
      resultJson = JSON.stringify(outcome.value === undefined ? null : outcome.value);
      if (resultJson === undefined) throw new TypeError(`a ${typeof outcome.value} has no JSON form`);
    } catch (error) {
      const failure = { type: "SerializationError", message: `the result has no JSON form: ${text(error)}`, terminal: true, retryAfterSeconds: null };
      return await report(() => client.fail(task, workerId, failure), "failed");
    }
    try {
      return await report(() => client.complete(task, workerId, resultJson), "completed");
    } catch (error) {
      if (error.status !== 413 && error.status !== 422) throw error;
      // dex refused the value (too large, a lone surrogate): it would refuse it again
      const failure = { type: error.type, message: error.detail, terminal: true, retryAfterSeconds: null };
      return await report(() => client.fail(task, workerId, failure), "failed");
    }
  } catch (error) {
    logger.error(`task ${task.task_id}: its report was refused: ${error.message}`);
    return "abandoned";
  } finally {
    beating = false;
    clearTimeout(timer);
  }

  async function report(send, done) {
    const backoff = new Backoff();
    for (;;) {
      try {
        await send();
        return done;
      } catch (error) {
        if (error.leaseLost) return "lost";
        if (!error.transient) throw error;
        if (controller.signal.aborted) return "cancelled";
        if (Date.now() > renewedAt + task.heartbeat_timeout * 1000) {
          logger.warn(`task ${task.task_id}: its report did not get through before its lease lapsed: ${error.message}`);
          return "abandoned";
        }
        const pause = backoff.nextPause(error.retryAfter);
        logger.warn(`task ${task.task_id}: report failed (${error.message}); again in ${pause.toFixed(1)} s`);
        await sleep(pause * 1000); // the heartbeats keep the lease meanwhile
      }
    }
  }
}

// The function's value or failure; once the signal aborts, the worker stops waiting for it.
async function called(fn, args, context, signal) {
  const aborted = new Promise((resolve) => signal.addEventListener("abort", () => resolve({ aborted: true }), { once: true }));
  const running = (async () => {
    try {
      return { value: await storage.run(context, () => fn(...args)) };
    } catch (error) {
      return { failure: failureOf(error) };
    }
  })();
  return Promise.race([running, aborted]);
}

/** What a thrown value reports: its name as the type, its message, terminal and retry_after
 * from an ApplicationError (or any error carrying them). Never throws, whatever was thrown. */
export function failureOf(thrown) {
  const read = (name) => {
    try {
      return thrown?.[name];
    } catch {
      return undefined;
    }
  };
  const isObject = thrown !== null && (typeof thrown === "object" || typeof thrown === "function");
  const name = isObject ? read("name") : undefined;
  const message = isObject ? read("message") : thrown;
  const retryAfter = isObject ? read("retryAfter") : undefined;
  return {
    type: typeof name === "string" && name ? name : isObject ? "Error" : `thrown ${typeof thrown}`,
    message: text(message),
    terminal: isObject && read("terminal") === true,
    retryAfterSeconds: typeof retryAfter === "number" && Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter : null,
  };
}

function text(value) {
  if (value === undefined) return "";
  try {
    return typeof value === "string" ? value : value instanceof Error ? String(value.message) : String(value);
  } catch {
    return `<unprintable ${typeof value}>`;
  }
}
