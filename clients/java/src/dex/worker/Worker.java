package dex.worker;

import java.lang.management.ManagementFactory;
import java.net.http.HttpClient;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.Semaphore;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;

/**
 * A dex worker: it long-polls dex web's remote-worker API ({@code /v1/activity-tasks}) for the
 * activities registered with it, runs each task on a pool of {@code concurrency} threads while
 * heartbeating, and reports the result or the error.
 *
 * <pre>{@code
 * Worker worker = new Worker(Worker.Options.of("http://127.0.0.1:8765").withToken(token).withConcurrency(8));
 * worker.register("resize-image", (context, args) -> resize((Map<?, ?>) args.get(0)));
 * worker.runUntilShutdown(); // SIGTERM or SIGINT: stop polling, finish what runs, then exit
 * }</pre>
 *
 * Only the JDK is used (java.net.http).
 */
public final class Worker {
    /** A worker's settings; only the URL is required ({@link #of}). */
    public record Options(
            String url,
            String token,
            String workerId,
            int concurrency,
            Duration pollWait,
            Duration maxHeartbeatInterval,
            Duration minBackoff,
            Duration maxBackoff,
            Consumer<String> log) {

        /**
         * The defaults: no token, the worker id java-HOST-PID, 4 tasks at once, long polls of
         * 20 s, heartbeats three times per lease and at least every 5 s, backoffs from 1 s to 30 s,
         * the log on standard error.
         */
        public static Options of(String url) {
            String id = "java-" + ManagementFactory.getRuntimeMXBean().getName().replace('@', '-');
            return new Options(url, null, id, 4, Duration.ofSeconds(20), Duration.ofSeconds(5),
                    Duration.ofSeconds(1), Duration.ofSeconds(30),
                    line -> System.err.println(Instant.now() + " " + line));
        }

        public Options withUrl(String value) {
            return new Options(value, token, workerId, concurrency, pollWait, maxHeartbeatInterval, minBackoff, maxBackoff, log);
        }

        public Options withToken(String value) {
            return new Options(url, value, workerId, concurrency, pollWait, maxHeartbeatInterval, minBackoff, maxBackoff, log);
        }

        public Options withWorkerId(String value) {
            return new Options(url, token, value, concurrency, pollWait, maxHeartbeatInterval, minBackoff, maxBackoff, log);
        }

        public Options withConcurrency(int value) {
            return new Options(url, token, workerId, value, pollWait, maxHeartbeatInterval, minBackoff, maxBackoff, log);
        }

        public Options withPollWait(Duration value) {
            return new Options(url, token, workerId, concurrency, value, maxHeartbeatInterval, minBackoff, maxBackoff, log);
        }

        public Options withMaxHeartbeatInterval(Duration value) {
            return new Options(url, token, workerId, concurrency, pollWait, value, minBackoff, maxBackoff, log);
        }

        public Options withBackoff(Duration min, Duration max) {
            return new Options(url, token, workerId, concurrency, pollWait, maxHeartbeatInterval, min, max, log);
        }

        public Options withLog(Consumer<String> value) {
            return new Options(url, token, workerId, concurrency, pollWait, maxHeartbeatInterval, minBackoff, maxBackoff, value);
        }
    }

    private final Options options;
    private final Api api;
    private final Map<String, Activity> activities = new ConcurrentHashMap<>();
    private final AtomicBoolean started = new AtomicBoolean();
    private final CountDownLatch stopping = new CountDownLatch(1);
    private final CountDownLatch finished = new CountDownLatch(1);
    private volatile CompletableFuture<Object> openPoll;

    /** A worker with no activities yet; IllegalArgumentException for settings dex would refuse. */
    public Worker(Options options) {
        if (options.url() == null || options.url().isEmpty()) {
            throw new IllegalArgumentException("the URL of dex web is required");
        }
        checkText("worker id", options.workerId());
        if (options.concurrency() < 1) {
            throw new IllegalArgumentException("concurrency must be at least 1, not " + options.concurrency());
        }
        if (options.pollWait().isNegative() || options.pollWait().compareTo(Duration.ofSeconds(60)) > 0) {
            throw new IllegalArgumentException("pollWait must be within 0 and 60 s, not " + options.pollWait());
        }
        if (options.minBackoff().isNegative() || options.minBackoff().isZero()
                || options.maxBackoff().compareTo(options.minBackoff()) < 0) {
            throw new IllegalArgumentException("the backoff must be positive, its maximum at least its minimum");
        }
        this.options = options;
        this.api = new Api(options.url(), options.token(),
                // HTTP/1.1: no h2c upgrade for proxies in between to get wrong
                HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(Duration.ofSeconds(10)).build());
    }

    /** Runs {@code activity} for the tasks called {@code name}; before {@link #run}. */
    public Worker register(String name, Activity activity) {
        checkText("activity name", name);
        if (activity == null) {
            throw new IllegalArgumentException("activity " + name + ": null");
        }
        if (started.get()) {
            throw new IllegalStateException("register before run");
        }
        if (activities.putIfAbsent(name, activity) != null) {
            throw new IllegalArgumentException("activity " + name + " is registered already");
        }
        return this;
    }

    /** Refuses what dex would refuse (422) in a name: empty, NUL, a lone surrogate. */
    static void checkText(String what, String value) {
        boolean valid = value != null && !value.isEmpty() && value.indexOf('\0') < 0;
        for (int i = 0; valid && i < value.length(); i++) {
            char c = value.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < value.length() && Character.isLowSurrogate(value.charAt(i + 1))) {
                i++;
            } else if (Character.isSurrogate(c)) {
                valid = false;
            }
        }
        if (!valid) {
            throw new IllegalArgumentException("the " + what + " must be non-empty, without NUL or a lone surrogate");
        }
    }

    /**
     * Polls and runs tasks until {@link #stop}; then lets the tasks it runs finish and report,
     * and returns. Failed calls are retried with an exponential backoff, never at once. Throws
     * (after the same drain) only when dex refuses the poll itself for good: a wrong token, say.
     */
    public void run() throws CallException, InterruptedException {
        if (activities.isEmpty()) {
            throw new IllegalStateException("no activity is registered");
        }
        if (!started.compareAndSet(false, true)) {
            throw new IllegalStateException("the worker runs already");
        }
        AtomicInteger threads = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(options.concurrency(), runnable -> {
            Thread thread = new Thread(runnable, "dex-activity-" + threads.incrementAndGet());
            thread.setDaemon(false); // the JVM waits for the tasks being drained
            return thread;
        });
        ScheduledExecutorService beats = Executors.newSingleThreadScheduledExecutor(runnable -> {
            Thread thread = new Thread(runnable, "dex-heartbeats");
            thread.setDaemon(true);
            return thread;
        });
        Semaphore places = new Semaphore(options.concurrency());
        Backoff backoff = new Backoff(options.minBackoff(), options.maxBackoff());
        List<String> names = new ArrayList<>(activities.keySet());
        CallException refused = null;
        options.log().accept("worker " + options.workerId() + " polling " + api.base() + " for " + String.join(", ", names));
        try {
            while (stopping.getCount() > 0) {
                if (!places.tryAcquire(100, TimeUnit.MILLISECONDS)) {
                    continue; // all places taken: look again (and at stopping)
                }
                int free = 1 + places.drainPermits();
                if (free > 100) {
                    places.release(free - 100); // a poll takes at most 100
                    free = 100;
                }
                List<Task> tasks;
                try {
                    tasks = poll(names, free);
                } catch (CallException e) {
                    places.release(free);
                    if (stopping.getCount() == 0) {
                        break;
                    }
                    if (!e.isTransient()) {
                        refused = e;
                        break;
                    }
                    Duration pause = backoff.next();
                    if (e.retryAfter() != null && e.retryAfter().compareTo(pause) > 0) {
                        pause = e.retryAfter();
                    }
                    options.log().accept("poll failed (" + e.getMessage() + "); polling again in " + pause.toMillis() + " ms");
                    stopping.await(pause.toMillis(), TimeUnit.MILLISECONDS);
                    continue;
                }
                backoff.reset();
                places.release(free - tasks.size());
                for (Task task : tasks) {
                    Attempt attempt = new Attempt(task, activities.get(task.name()), api, options, beats);
                    pool.execute(() -> {
                        try {
                            attempt.run();
                        } finally {
                            places.release();
                        }
                    });
                }
            }
        } finally {
            pool.shutdown();
            while (!pool.awaitTermination(1, TimeUnit.MINUTES)) {
                options.log().accept("draining: tasks still run");
            }
            beats.shutdownNow();
            finished.countDown();
        }
        if (refused != null) {
            throw refused;
        }
    }

    private List<Task> poll(List<String> names, int max) throws CallException, InterruptedException {
        Map<String, Object> body = Map.of(
                "worker_id", options.workerId(), "names", names, "max", max,
                "wait_seconds", options.pollWait().toSeconds());
        // the server gets the wait and then some before the poll counts as lost
        openPoll = api.post("/v1/activity-tasks/poll", body, options.pollWait().plusSeconds(30));
        if (stopping.getCount() == 0) {
            openPoll.cancel(true);
        }
        Object answer;
        try {
            answer = openPoll.get();
        } catch (CancellationException abandoned) { // by stop(): its claims, if any, return after their lease
            return List.of();
        } catch (ExecutionException e) {
            if (e.getCause() instanceof CallException refused) {
                throw refused;
            }
            throw new CallException("/v1/activity-tasks/poll", 0, "NoAnswer", String.valueOf(e.getCause()), null);
        }
        List<Task> tasks = new ArrayList<>();
        if (!(answer instanceof List<?> items)) {
            throw new CallException("/v1/activity-tasks/poll", 200, "BadAnswer", "not a list of tasks", null);
        }
        for (Object item : items.subList(0, Math.min(items.size(), max))) {
            try {
                tasks.add(Task.of(item));
            } catch (RuntimeException malformed) { // not dex's answer (a proxy's?): the tasks return after their lease
                throw new CallException("/v1/activity-tasks/poll", 200, "BadAnswer", "a malformed task: " + malformed, null);
            }
        }
        return tasks;
    }

    /** Stops polling (the open poll is abandoned); {@link #run} returns once the running tasks reported. */
    public void stop() {
        stopping.countDown();
        CompletableFuture<Object> poll = openPoll;
        if (poll != null) {
            poll.cancel(true);
        }
    }

    /** Waits until {@link #run} has drained; false when {@code timeout} passed first. */
    public boolean awaitStopped(Duration timeout) throws InterruptedException {
        return finished.await(timeout.toMillis(), TimeUnit.MILLISECONDS);
    }

    /**
     * {@link #run} with a shutdown hook: on SIGTERM or SIGINT the JVM runs the hook, which stops
     * polling and waits for the running tasks to finish and report before the JVM exits.
     */
    public void runUntilShutdown() throws CallException, InterruptedException {
        Thread hook = new Thread(() -> {
            stop();
            try {
                finished.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, "dex-worker-drain");
        Runtime.getRuntime().addShutdownHook(hook);
        try {
            run();
        } finally {
            try {
                Runtime.getRuntime().removeShutdownHook(hook);
            } catch (IllegalStateException shuttingDown) {
                // the hook runs: the JVM exits once it returns
            }
        }
    }

    /** Doubles a pause from min to max, with jitter so that workers do not call a recovering server in step. */
    static final class Backoff {
        private final Duration min;
        private final Duration max;
        private Duration current;

        Backoff(Duration min, Duration max) {
            this.min = min;
            this.max = max;
        }

        Duration next() {
            current = current == null ? min : current.multipliedBy(2);
            if (current.compareTo(max) > 0) {
                current = max;
            }
            long millis = current.toMillis();
            return Duration.ofMillis(millis - ThreadLocalRandom.current().nextLong(millis / 4 + 1)); // 3/4 to all of it
        }

        void reset() {
            current = null;
        }
    }
}
