// The errors an activity throws to steer its retries, as dex.ApplicationError and
// dex.TerminalError do in Python activities.

/** A failure of the activity: `terminal` stops the retries at once; `retryAfter` (seconds)
 * replaces the delay the retry policy would compute for the next attempt. */
export class ApplicationError extends Error {
  constructor(message = "", { terminal = false, retryAfter = null, type = null } = {}) {
    super(message);
    this.name = type || new.target.name;
    this.terminal = Boolean(terminal);
    this.retryAfter = retryAfter;
  }
}

/** A failure that must not be retried. */
export class TerminalError extends ApplicationError {
  constructor(message = "", { type = null } = {}) {
    super(message, { terminal: true, type });
  }
}
