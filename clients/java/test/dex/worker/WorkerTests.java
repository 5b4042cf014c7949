package dex.worker;

import static dex.worker.Dex.await;
import static dex.worker.Dex.background;
import static dex.worker.Dex.call;
import static dex.worker.Dex.cause;
import static dex.worker.Dex.check;
import static dex.worker.Dex.expectResult;
import static dex.worker.Dex.options;
import static dex.worker.Dex.start;
import static dex.worker.Dex.startRaw;
import static dex.worker.Dex.stop;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/** The worker against a real dex web. */
final class WorkerTests {
    private WorkerTests() {}

    static void register(Map<String, TestMain.Check> tests) {
        tests.put("completesActivitiesWithTheirArguments", WorkerTests::completes);
        tests.put("aWrongTokenEndsRunWithAnError", WorkerTests::wrongToken);
        tests.put("namesDexWouldRefuseAreRefusedAtRegister", WorkerTests::names);
        tests.put("atMostConcurrencyTasksRunAtOnce", WorkerTests::concurrency);
        tests.put("heartbeatsKeepATaskLongerThanItsLease", WorkerTests::heartbeats);
        tests.put("cancellingTheRunInterruptsTheActivity", WorkerTests::cancellation);
        tests.put("terminalRetriedAndRetryAfterErrors", WorkerTests::errors);
        tests.put("poisonAffectsOnlyItsOwnRun", WorkerTests::poison);
        tests.put("stopDrainsTheTasksRunningBeforeRunReturns", WorkerTests::drain);
        tests.put("aPollCutOffByStopEndsRunAtOnce", WorkerTests::cutOff);
    }

    static Object echo(ActivityContext context, List<Object> args) {
        return args.get(0);
    }

    static void completes() throws Exception {
        Worker worker = new Worker(options("args")).register("java-resize", (context, args) -> {
            Map<?, ?> image = (Map<?, ?>) args.get(0);
            long factor = (Long) args.get(1);
            return Map.of("name", image.get("name"), "width", (Long) image.get("width") / factor,
                    "attempt", context.task().attempt());
        });
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        try {
            List<String> runs = new ArrayList<>();
            for (int i = 1; i <= 3; i++) {
                runs.add(start("java-resize", "[{\"name\": \"cat.png\", \"width\": 640}, " + i + "]", 1));
            }
            for (int i = 0; i < runs.size(); i++) {
                Map<?, ?> run = await(runs.get(i), 20);
                Map<?, ?> result = (Map<?, ?>) run.get("result");
                check(result.get("name").equals("cat.png") && result.get("width").equals(640L / (i + 1))
                        && result.get("attempt").equals(1L), "result " + result);
            }
        } finally {
            stop(worker, thread);
        }
        check(errors.isEmpty(), "run() failed: " + errors);
    }

    static void wrongToken() throws Exception {
        Worker worker = new Worker(options("token").withToken("not-the-token")).register("java-token", WorkerTests::echo);
        long began = System.nanoTime();
        try {
            worker.run();
            throw new AssertionError("run() returned with a token dex refuses");
        } catch (CallException refused) {
            check(refused.status() == 401, "refused with " + refused);
        }
        check(System.nanoTime() - began < 10_000_000_000L, "it took long to give up");
    }

    static void names() {
        Worker worker = new Worker(options("names"));
        for (String name : new String[] {"", "a\u0000b", "lone\ud800surrogate", null}) {
            try {
                worker.register(name, WorkerTests::echo);
                throw new AssertionError("registered " + name);
            } catch (IllegalArgumentException expected) {
                // refused here, not by dex at each poll
            }
        }
        try {
            new Worker(options("names").withWorkerId("nul\u0000id"));
            throw new AssertionError("a worker id with NUL was accepted");
        } catch (IllegalArgumentException expected) {
            // refused
        }
        try {
            worker.run();
            throw new AssertionError("run() without activities");
        } catch (IllegalStateException expected) {
            // refused
        } catch (Exception other) {
            throw new AssertionError(other);
        }
    }

    static void concurrency() throws Exception {
        AtomicInteger running = new AtomicInteger();
        AtomicInteger most = new AtomicInteger();
        Worker worker = new Worker(options("concurrency").withConcurrency(3)).register("java-busy", (context, args) -> {
            most.accumulateAndGet(running.incrementAndGet(), Math::max);
            try {
                Thread.sleep(300);
            } finally {
                running.decrementAndGet();
            }
            return args.get(0);
        });
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        try {
            String runId = startRaw("{\"workflow\": \"sdk-fan-out\", \"args\": [\"java-busy\", 9]}");
            expectResult(await(runId, 30), List.of(0L, 1L, 2L, 3L, 4L, 5L, 6L, 7L, 8L));
        } finally {
            stop(worker, thread);
        }
        check(most.get() == 3, "at most " + most.get() + " tasks ran at once, want 3 (the limit, reached)");
    }

    static void heartbeats() throws Exception {
        Worker worker = new Worker(options("heartbeat")).register("java-long", (context, args) -> {
            Thread.sleep((long) (context.task().heartbeatTimeout() * 1800)); // the lease is 2 s
            return context.task().attempt();
        });
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        try {
            expectResult(await(start("java-long", "[]", 3), 30), 1L); // never claimed again
        } finally {
            stop(worker, thread);
        }
    }

    static void cancellation() throws Exception {
        CountDownLatch started = new CountDownLatch(1);
        AtomicReference<String> seen = new AtomicReference<>();
        CountDownLatch stopped = new CountDownLatch(1);
        Worker worker = new Worker(options("cancel")).register("java-wait", (context, args) -> {
            started.countDown();
            try {
                Thread.sleep(60_000);
                seen.set("never interrupted");
            } catch (InterruptedException e) {
                seen.set("interrupted, cancelled " + context.cancelled());
            } finally {
                stopped.countDown();
            }
            return "stopped"; // not recorded: the run is over
        });
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        try {
            String runId = start("java-wait", "[]", 1);
            check(started.await(20, TimeUnit.SECONDS), "the task did not start");
            Dex.Answer cancelled = call("POST", "/v1/runs/" + runId + "/cancel", "{}");
            check(cancelled.status() == 202, "cancel: " + cancelled);
            check(stopped.await(15, TimeUnit.SECONDS), "the activity was not interrupted");
            check("interrupted, cancelled true".equals(seen.get()), "the activity saw: " + seen.get());
            check("CANCELLED".equals(await(runId, 10).get("status")), "the run is not cancelled");
        } finally {
            stop(worker, thread);
        }
    }

    static void errors() throws Exception {
        Map<String, List<Long>> attempts = new ConcurrentHashMap<>();
        Worker worker = new Worker(options("errors"))
                .register("java-terminal", (context, args) -> {
                    note(attempts, context);
                    throw ActivityError.terminal("Refused", "no such image");
                })
                .register("java-flaky", (context, args) -> {
                    if (note(attempts, context) < 3) {
                        throw new IllegalStateException("upstream slow");
                    }
                    return "third time";
                })
                .register("java-later", (context, args) -> {
                    if (note(attempts, context) == 1) {
                        throw ActivityError.retryAfter("RateLimited", "come back later", Duration.ofMillis(1500));
                    }
                    return "later";
                });
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        try {
            String terminal = start("java-terminal", "[]", 5);
            String flaky = start("java-flaky", "[]", 3);
            String later = start("java-later", "[]", 2);
            Map<?, ?> failed = cause(await(terminal, 20));
            check(failed.get("type").equals("Refused") && failed.get("message").equals("no such image"), "failure " + failed);
            expectResult(await(flaky, 20), "third time");
            expectResult(await(later, 20), "later");
            check(attempts.get(terminal).size() == 1 && attempts.get(flaky).size() == 3,
                    "attempts: terminal " + attempts.get(terminal) + ", flaky " + attempts.get(flaky));
            long gap = attempts.get(later).get(1) - attempts.get(later).get(0);
            check(gap >= 1_200_000_000L, "the retry came " + gap / 1_000_000 + " ms after the failure, not 1.5 s");
        } finally {
            stop(worker, thread);
        }
    }

    private static int note(Map<String, List<Long>> attempts, ActivityContext context) {
        attempts.computeIfAbsent(context.task().runId(), id -> Collections.synchronizedList(new ArrayList<>()))
                .add(System.nanoTime());
        return context.task().attempt();
    }

    static final class Unreadable extends RuntimeException {
        private static final long serialVersionUID = 1L;

        @Override
        public String getMessage() {
            throw new IllegalStateException("a getMessage that throws");
        }
    }

    static void poison() throws Exception {
        Worker worker = new Worker(options("poison"))
                .register("java-echo", WorkerTests::echo)
                .register("java-throws", (context, args) -> {
                    throw new IllegalArgumentException("the activity threw");
                })
                .register("java-unreadable", (context, args) -> {
                    throw new Unreadable();
                })
                .register("java-overflow", (context, args) -> recurse(0))
                .register("java-nan", (context, args) -> Double.NaN)
                .register("java-hostile-result", (context, args) -> new java.util.AbstractMap<String, Object>() {
                    @Override
                    public java.util.Set<Map.Entry<String, Object>> entrySet() {
                        throw new IllegalStateException("a map that cannot be read");
                    }
                })
                .register("java-surrogate-result", (context, args) -> "a\ud800b")
                .register("java-nul-error", (context, args) -> {
                    throw ActivityError.terminal("Nul\u0000Type", "x\u0000y\ud800");
                });
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        try {
            // NUL crosses both ways; a lone surrogate is refused at the start (dex keeps only valid Unicode)
            expectResult(await(start("java-echo", "[\"a\\u0000b\\u00e9c\\ud83d\\ude00\"]", 1), 20), "a\u0000b\u00e9c\ud83d\ude00");
            Dex.Answer refused = call("POST", "/v1/runs", "{\"workflow\": \"sdk-call\", \"args\": [\"java-echo\", [\"a\\ud800b\"], 1]}");
            check(refused.status() == 422, "a lone surrogate in the arguments: " + refused);

            Map<?, ?> thrown = cause(await(start("java-throws", "[]", 1), 20));
            check(thrown.get("type").equals("IllegalArgumentException") && thrown.get("message").equals("the activity threw"),
                    "recorded as " + thrown);
            Map<?, ?> unreadable = cause(await(start("java-unreadable", "[]", 1), 20));
            check(unreadable.get("type").equals("Unreadable") && ((String) unreadable.get("message")).contains("could not be read"),
                    "recorded as " + unreadable);
            Map<?, ?> overflow = cause(await(start("java-overflow", "[]", 1), 20));
            check(overflow.get("type").equals("StackOverflowError"), "recorded as " + overflow);
            Map<?, ?> nan = cause(await(start("java-nan", "[]", 3), 20));
            check(nan.get("type").equals("ResultNotJSON"), "recorded as " + nan);
            Map<?, ?> hostile = cause(await(start("java-hostile-result", "[]", 3), 20));
            check(hostile.get("type").equals("ResultNotJSON") && hostile.get("message").equals("a map that cannot be read"),
                    "recorded as " + hostile);
            // dex refuses a result that is not valid Unicode (422): the attempt fails for good, saying why
            Map<?, ?> surrogate = cause(await(start("java-surrogate-result", "[]", 3), 20));
            check(surrogate.get("type").equals("ResultRefused") && ((String) surrogate.get("message")).contains("422"),
                    "recorded as " + surrogate);
            // error texts may hold anything: NUL as it is, a lone surrogate as its visible escape
            Map<?, ?> nul = cause(await(start("java-nul-error", "[]", 3), 20));
            check(nul.get("type").equals("Nul\u0000Type") && nul.get("message").equals("x\u0000y\\ud800"),
                    "recorded as " + Json.write(nul));

            // the worker goes on: a healthy task afterwards
            expectResult(await(start("java-echo", "[{\"healthy\": true}]", 1), 20), Map.of("healthy", true));
        } finally {
            stop(worker, thread);
        }
        check(errors.isEmpty(), "run() failed: " + errors);
    }

    private static int recurse(int depth) {
        return recurse(depth + 1) + 1;
    }

    static void drain() throws Exception {
        CountDownLatch started = new CountDownLatch(1);
        AtomicReference<Long> finished = new AtomicReference<>();
        Worker worker = new Worker(options("drain")).register("java-drain", (context, args) -> {
            started.countDown();
            Thread.sleep(1000);
            finished.set(System.nanoTime());
            return "drained";
        });
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        String runId = start("java-drain", "[]", 1);
        check(started.await(20, TimeUnit.SECONDS), "the task did not start");
        stop(worker, thread);
        check(finished.get() != null, "run() returned before its task finished");
        expectResult(await(runId, 10), "drained");
        check(errors.isEmpty(), "run() failed: " + errors);
    }

    static void cutOff() throws Exception {
        Worker worker = new Worker(options("idle").withPollWait(Duration.ofSeconds(4))) // ends on the server meanwhile
                .register("java-idle", WorkerTests::echo);
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        Thread.sleep(500); // the long poll is open
        long began = System.nanoTime();
        worker.stop();
        thread.join(10_000);
        check(System.nanoTime() - began < 2_000_000_000L, "run() waited for its long poll to end");
        check(errors.isEmpty(), "run() failed: " + errors);
    }
}
