// The four calls of dex's remote-worker API (POST /v1/activity-tasks/...) over the global
// fetch, and the backoff the worker waits with between failed calls.
//
// A call that does not succeed throws a WorkerCallError with the HTTP status (0 when no answer
// came: the server is down, the connection broke, the call timed out), dex's error type and
// message ({"error": {"type", "message"}}), and the Retry-After the server asked for.

const ANSWER_MARGIN_MS = 30_000; // a long poll may take its wait plus this before it is given up
const SHORT_CALL_MS = 30_000; // complete, fail and heartbeat
const MAX_FAILURE_TEXT = 40_000; // characters of an error text dex keeps; longer ones are cut so
const HEAD = 32_768;
const TAIL = 4_096;

export class WorkerCallError extends Error {
  constructor(status, type, message, retryAfter = null) {
    super(`${status || "no answer"} ${type}: ${message}`);
    this.name = "WorkerCallError";
    this.status = status;
    this.type = type;
    this.detail = message;
    this.retryAfter = retryAfter; // seconds, or null
  }

  /** 409: the task is no longer ours (the lease lapsed, another worker has it, the run ended). */
  get leaseLost() {
    return this.status === 409;
  }

  /** No answer, or the server or its store failed: the same call may succeed later. */
  get transient() {
    return this.status === 0 || this.status === 429 || this.status >= 500;
  }
}

/** An error text as dex keeps it: at most 40,000 characters, the first 32,768 and the last
 * 4,096 of a longer one around a note (so a huge message never makes a body the server refuses). */
export function failureText(text) {
  if (text.length <= MAX_FAILURE_TEXT) return text;
  const note = `[truncated: ${text.length} characters, kept the first ${HEAD} and last ${TAIL}]`;
  return `${text.slice(0, HEAD)}\n… ${note} …\n${text.slice(-TAIL)}`;
}

export class ActivityTaskClient {
  constructor(url, token = null) {
    this.base = url.replace(/\/+$/, "") + "/v1/activity-tasks";
    this.headers = { "content-type": "application/json", accept: "application/json" };
    if (token !== null && token !== undefined) this.headers.authorization = `Bearer ${token}`;
  }

  /** Claim up to `count` tasks named in `names`, waiting up to `waitSeconds` for one. */
  async poll(workerId, names, count, waitSeconds) {
    const body = JSON.stringify({ worker_id: workerId, names, max: count, wait_seconds: waitSeconds });
    const answer = await this.post("/poll", body, waitSeconds * 1000 + ANSWER_MARGIN_MS);
    if (!Array.isArray(answer)) throw new WorkerCallError(200, "BadAnswer", "the poll did not answer a list of tasks");
    return answer;
  }

  /** Renew the task's lease; true when the run asks the task to stop (cancel_requested). */
  async heartbeat(task, workerId) {
    const body = JSON.stringify({ lease_version: task.lease_version, worker_id: workerId });
    const answer = await this.post(`/${task.task_id}/heartbeat`, body, SHORT_CALL_MS);
    return Boolean(answer && answer.cancel_requested);
  }

  /** Report the task's result; `resultJson` is its JSON text. */
  async complete(task, workerId, resultJson) {
    const head = JSON.stringify({ lease_version: task.lease_version, worker_id: workerId });
    await this.post(`/${task.task_id}/complete`, `${head.slice(0, -1)},"result":${resultJson}}`, SHORT_CALL_MS);
  }

  /** Report the task's failure: {type, message, terminal, retryAfterSeconds}. */
  async fail(task, workerId, failure) {
    const error = {
      type: failureText(failure.type) || "Error",
      message: failureText(failure.message),
      terminal: failure.terminal,
      retry_after_seconds: failure.retryAfterSeconds,
    };
    const body = JSON.stringify({ lease_version: task.lease_version, worker_id: workerId, error });
    await this.post(`/${task.task_id}/fail`, body, SHORT_CALL_MS);
  }

  async post(path, body, timeoutMs) {
    let response;
    let text;
    try {
      response = await fetch(this.base + path, {
        method: "POST",
        headers: this.headers,
        body,
        signal: AbortSignal.timeout(timeoutMs),
      });
      text = await response.text();
    } catch (error) {
      // refused, reset, timed out: no answer
      throw new WorkerCallError(0, error?.cause?.code || error?.name || "NetworkError", String(error?.message));
    }
    let answer = null;
    try {
      answer = JSON.parse(text);
    } catch {
      if (response.ok) throw new WorkerCallError(response.status, "BadAnswer", "the answer is not JSON");
    }
    if (!response.ok) {
      const error = (answer && typeof answer === "object" && answer.error) || {};
      const header = Number(response.headers.get("retry-after"));
      throw new WorkerCallError(
        response.status,
        typeof error.type === "string" ? error.type : `HTTP${response.status}`,
        typeof error.message === "string" ? error.message : response.statusText,
        Number.isFinite(header) && header >= 0 && response.headers.has("retry-after") ? header : null,
      );
    }
    return answer;
  }
}

/** Growing pauses between failed calls: `initial` seconds doubled at each failure up to
 * `maximum`, each drawn between half and all of that; a server's Retry-After is honoured when it
 * asks for longer. */
export class Backoff {
  constructor(initial = 0.5, maximum = 30, random = Math.random) {
    this.initial = initial;
    this.maximum = maximum;
    this.random = random;
    this.failures = 0;
  }

  /** The pause, in seconds, before the next call; one more failure counted. */
  nextPause(retryAfter = null) {
    const ceiling = Math.min(this.maximum, this.initial * 2 ** Math.min(this.failures, 32));
    this.failures += 1;
    const pause = ceiling / 2 + this.random() * (ceiling / 2);
    return retryAfter === null ? pause : Math.max(pause, Math.min(retryAfter, this.maximum));
  }

  reset() {
    this.failures = 0;
  }
}
