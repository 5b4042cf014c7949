// Types of @dex-engine/worker, for TypeScript users and editors (the package itself is plain JS).

/** A JSON value: what an activity receives and returns. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export interface Logger {
  info(line: string): void;
  warn(line: string): void;
  error(line: string): void;
}

export interface WorkerOptions {
  /** The dex server (`dex web`), http:// or https://. */
  url: string;
  /** Its bearer token (`dex web --token`). */
  token?: string | null;
  /** The most tasks run at once (8). */
  concurrency?: number;
  /** The worker's name in the tasks' leases (node-HOST-PID). */
  workerId?: string | null;
  /** How long one poll waits for work, 0-60 seconds (10); a stop waits for it. */
  pollWaitSeconds?: number;
  /** The longest pause between a task's heartbeats, in seconds (2). */
  maxHeartbeatInterval?: number;
  /** Where warnings and errors go (stderr). */
  logger?: Logger;
}

/** An activity: called with the workflow's arguments, returns a JSON value (or a promise of one). */
export type Activity = (...args: any[]) => unknown;

export class Worker {
  constructor(options: WorkerOptions);
  readonly workerId: string;
  readonly concurrency: number;
  /** Register `fn` as the activity `name`; returns the worker. */
  register(name: string, fn: Activity): this;
  /** Poll and run tasks until stop(), SIGTERM or SIGINT; resolves once the tasks in flight are reported. */
  run(options?: { handleSignals?: boolean }): Promise<void>;
  /** Stop polling; run() resolves once the tasks in flight are reported. */
  stop(): void;
}

export interface ActivityContext {
  readonly taskId: number;
  readonly runId: string;
  readonly name: string;
  readonly attempt: number;
  /** Aborts once the run was cancelled or ended, or the task's lease was lost. */
  readonly signal: AbortSignal;
  readonly cancelRequested: boolean;
  /** Renew the lease now; false once the attempt should stop. */
  heartbeat(): Promise<boolean>;
}

/** The context of the activity running here; throws outside an activity. */
export function activityContext(): ActivityContext;

export class ApplicationError extends Error {
  constructor(message?: string, options?: { terminal?: boolean; retryAfter?: number | null; type?: string | null });
  terminal: boolean;
  /** Seconds before the next attempt, instead of the retry policy's delay. */
  retryAfter: number | null;
}

export class TerminalError extends ApplicationError {
  constructor(message?: string, options?: { type?: string | null });
}

export class WorkerCallError extends Error {
  /** The HTTP status, or 0 when no answer came. */
  readonly status: number;
  /** dex's error type, e.g. LeaseLost. */
  readonly type: string;
  readonly detail: string;
  /** Seconds the server asked to wait (Retry-After), or null. */
  readonly retryAfter: number | null;
  readonly leaseLost: boolean;
  readonly transient: boolean;
}
