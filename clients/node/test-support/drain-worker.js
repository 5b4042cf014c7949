// A worker process for the SIGTERM test: one place, one slow activity; prints "started" when
// its task begins and "drained" when run() resolved.
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "../src/index.js";

const worker = new Worker({ url: process.env.DEX_URL, token: process.env.DEX_TOKEN || null, concurrency: 1, pollWaitSeconds: 1 });
worker.register("sdk-slow", async (seconds) => {
  console.log("started");
  await sleep(seconds * 1000);
  return { slept: seconds };
});
await worker.run();
console.log("drained");
