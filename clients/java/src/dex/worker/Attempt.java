package dex.worker;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One claimed task, from the poll to its report: the activity runs on this thread while the
 * heartbeats go out (and interrupt it when dex says the run is over or the lease is lost); then
 * the result or the error goes to dex, sent again after a failed call for as long as the lease
 * would hold.
 */
final class Attempt {
    private final Task task;
    private final Activity activity;
    private final Api api;
    private final Worker.Options options;
    private final ScheduledExecutorService beats;
    private final ActivityContext context;
    private final String path;
    private final Duration timeout;
    private final AtomicLong renewed = new AtomicLong(System.nanoTime()); // when dex last confirmed the lease
    private final AtomicBoolean beating = new AtomicBoolean(); // a heartbeat is on its way
    private final Object running = new Object();
    private Thread runner; // the thread while the activity runs, else null (guarded by running)

    Attempt(Task task, Activity activity, Api api, Worker.Options options, ScheduledExecutorService beats) {
        this.task = task;
        this.activity = activity;
        this.api = api;
        this.options = options;
        this.beats = beats;
        this.context = new ActivityContext(task);
        this.path = "/v1/activity-tasks/" + task.taskId() + "/";
        this.timeout = Duration.ofMillis((long) (task.heartbeatTimeout() * 1000));
    }

    void run() {
        long every = Math.max(50, Math.min(timeout.toMillis() / 3, options.maxHeartbeatInterval().toMillis()));
        ScheduledFuture<?> heartbeats = beats.scheduleWithFixedDelay(this::heartbeat, every, every, TimeUnit.MILLISECONDS);
        String outcome;
        try {
            outcome = attempt();
        } catch (InterruptedException e) {
            outcome = "interrupted";
        } catch (RuntimeException e) { // a fault of this SDK: the task returns after its lease
            outcome = "error: " + e;
        } finally {
            heartbeats.cancel(false);
        }
        options.log().accept("task " + task.taskId() + " " + task.name() + " attempt " + task.attempt() + ": " + outcome);
    }

    private String attempt() throws InterruptedException {
        if (activity == null) { // dex hands out only the names polled for
            return fail(failure("NotRegistered", "no activity " + task.name() + " in this worker", true, null));
        }
        Object result = null;
        Throwable error = null;
        synchronized (running) {
            runner = Thread.currentThread();
        }
        try {
            result = activity.run(context, task.args());
        } catch (Throwable thrown) { // Errors too (a StackOverflowError): the worker goes on
            error = thrown;
        } finally {
            synchronized (running) {
                runner = null;
            }
            Thread.interrupted(); // an interrupt meant for the activity must not cut the report short
        }
        if (context.ended() != null) {
            return context.ended(); // the run is over or the task is another's: nothing of ours is recorded
        }
        if (error != null) {
            return fail(failureOf(error));
        }
        String encoded;
        try {
            encoded = Json.write(result);
        } catch (RuntimeException | StackOverflowError e) {
            // NaN, an object with no JSON form, a collection that throws: the same next time
            return fail(failure("ResultNotJSON", describe(e), true, null));
        }
        Map<String, Object> body = lease();
        body.put("result", new Json.Raw(encoded));
        try {
            return report("complete", body) ? "completed" : "lost";
        } catch (CallException refused) { // too large, say: the same next time, so it fails for good
            return fail(failure("ResultRefused", refused.getMessage(), true, null));
        }
    }

    private Map<String, Object> lease() {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("lease_version", task.leaseVersion());
        body.put("worker_id", options.workerId());
        return body;
    }

    private String fail(Map<String, Object> error) throws InterruptedException {
        Map<String, Object> body = lease();
        body.put("error", error);
        try {
            return report("fail", body) ? "failed" : "lost";
        } catch (CallException refused) {
            options.log().accept("dex refused the failure of task " + task.taskId() + ": " + refused.getMessage());
            return "refused";
        }
    }

    /**
     * Sends a complete or a fail, again after a call that failed on the way or in the server, for
     * as long as the lease would hold (later, dex gives the task to its next attempt anyway).
     * True when dex took it, false when the lease is gone (409); dex's other refusals are thrown.
     */
    private boolean report(String call, Map<String, Object> body) throws CallException, InterruptedException {
        Worker.Backoff pause = new Worker.Backoff(options.minBackoff().dividedBy(4).plusMillis(1), options.maxBackoff());
        while (true) {
            try {
                api.call(path + call, body, Duration.ofSeconds(30));
                return true;
            } catch (CallException e) {
                if (e.status() == 409) {
                    // the lease lapsed, the run ended, or (a call cut off on the way back) our first call went through
                    return false;
                }
                if (!e.isTransient()) {
                    throw e;
                }
                if (context.ended() != null) {
                    return false;
                }
                Duration wait = pause.next();
                Duration held = Duration.ofNanos(System.nanoTime() - renewed.get());
                if (held.plus(wait).compareTo(timeout) > 0) {
                    options.log().accept("could not " + call + " task " + task.taskId() + " before its lease lapsed ("
                            + e.getMessage() + "): dex retries it");
                    return false;
                }
                options.log().accept(call + " of task " + task.taskId() + " failed (" + e.getMessage() + "); again in "
                        + wait.toMillis() + " ms");
                Thread.sleep(wait.toMillis());
            }
        }
    }

    private void heartbeat() {
        if (context.ended() != null || !beating.compareAndSet(false, true)) {
            return; // over, or the last one is still on its way
        }
        long sent = System.nanoTime();
        Duration within = Duration.ofMillis(Math.max(100, timeout.toMillis() / 2));
        api.post(path + "heartbeat", lease(), within).whenComplete((answer, error) -> {
            beating.set(false);
            if (error == null) {
                if (answer instanceof Map<?, ?> fields && Boolean.TRUE.equals(fields.get("cancel_requested"))) {
                    end("cancelled");
                } else {
                    renewed.accumulateAndGet(sent, Math::max);
                }
            } else if (error.getCause() instanceof CallException refused && refused.status() == 409) {
                end("lost");
            } else { // the server or the way there failed: the next beat tries again, within the lease
                options.log().accept("heartbeat of task " + task.taskId() + " failed: " + describe(error.getCause()));
            }
        });
    }

    private void end(String why) {
        if (context.end(why)) {
            synchronized (running) {
                if (runner != null) {
                    runner.interrupt();
                }
            }
        }
    }

    static Map<String, Object> failure(String type, String message, boolean terminal, Duration retryAfter) {
        Map<String, Object> error = new LinkedHashMap<>();
        error.put("type", type);
        error.put("message", message == null ? "" : message);
        error.put("terminal", terminal);
        if (retryAfter != null && !retryAfter.isNegative() && !retryAfter.isZero()) {
            error.put("retry_after_seconds", retryAfter.toMillis() / 1000.0);
        }
        return error;
    }

    /** What dex is told of an activity's exception; never throws, whatever its getMessage does. */
    static Map<String, Object> failureOf(Throwable error) {
        if (error instanceof ActivityError chosen) {
            return failure(chosen.type(), describe(chosen), chosen.terminal(), chosen.retryAfter());
        }
        String type = error.getClass().getSimpleName();
        return failure(type.isEmpty() ? error.getClass().getName() : type, describe(error), false, null);
    }

    static String describe(Throwable error) {
        try {
            String message = error.getMessage();
            return message == null ? "" : message;
        } catch (Throwable unreadable) {
            return "(its message could not be read: " + unreadable.getClass().getName() + ")";
        }
    }
}
