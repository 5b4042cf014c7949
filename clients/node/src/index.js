// A worker for dex activities in Node (no dependencies): see README.md.
export { Worker } from "./worker.js";
export { activityContext } from "./attempt.js";
export { ApplicationError, TerminalError } from "./errors.js";
export { WorkerCallError } from "./client.js";
