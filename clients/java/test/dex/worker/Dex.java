package dex.worker;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;

/**
 * The dex web the tests run against (DEX_URL, DEX_TOKEN: tests/remote/test_sdk_java.py serves
 * one), runs started and read back over its JSON API, and the checks the tests share.
 */
final class Dex {
    static final String URL = System.getenv().getOrDefault("DEX_URL", "").replaceAll("/+$", "");
    static final String TOKEN = System.getenv().getOrDefault("DEX_TOKEN", "");
    private static final HttpClient HTTP = HttpClient.newHttpClient();

    private Dex() {}

    record Answer(int status, Object json) {}

    /** A request with the token; raw JSON text in, the status and the decoded answer out. */
    static Answer call(String method, String path, String body) throws Exception {
        HttpRequest request = HttpRequest.newBuilder(URI.create(URL + path))
                .header("Content-Type", "application/json")
                .header("Authorization", "Bearer " + TOKEN)
                .method(method, body == null
                        ? HttpRequest.BodyPublishers.noBody()
                        : HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8))
                .timeout(Duration.ofSeconds(30))
                .build();
        HttpResponse<String> response = HTTP.send(request, HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
        return new Answer(response.statusCode(), Json.parse(response.body()));
    }

    /** Starts sdk-call(name, args, maxAttempts); args is raw JSON (an array). */
    static String start(String name, String args, int maxAttempts) throws Exception {
        return startRaw("{\"workflow\": \"sdk-call\", \"args\": [" + Json.write(name) + ", " + args + ", " + maxAttempts + "]}");
    }

    static String startRaw(String body) throws Exception {
        Answer started = call("POST", "/v1/runs", body);
        check(started.status() == 201, "starting " + body + ": " + started);
        return (String) ((Map<?, ?>) started.json()).get("run_id");
    }

    /**
     * The run once it ended (failing the test after {@code seconds}), reported on a line
     * {@code dex-run RUN_ID STATUS} that the pytest module checks against the engine.
     */
    static Map<?, ?> await(String runId, int seconds) throws Exception {
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        while (true) {
            Answer read = call("GET", "/v1/runs/" + runId, null);
            check(read.status() == 200, "reading run " + runId + ": " + read);
            Map<?, ?> run = (Map<?, ?>) read.json();
            Object status = run.get("status");
            if (List.of("COMPLETED", "FAILED", "CANCELLED").contains(status)) {
                System.out.println("dex-run " + runId + " " + status);
                return run;
            }
            check(System.nanoTime() < deadline, "run " + runId + " is still " + status + " after " + seconds + " s");
            Thread.sleep(50);
        }
    }

    static void expectResult(Map<?, ?> run, Object want) {
        check("COMPLETED".equals(run.get("status")), "the run is " + run.get("status") + ": " + run.get("failure"));
        check(Json.write(run.get("result")).equals(Json.write(want)),
                "result " + Json.write(run.get("result")) + ", want " + Json.write(want));
    }

    /** The activity's failure under the workflow's ActivityFailedError. */
    static Map<?, ?> cause(Map<?, ?> run) {
        check("FAILED".equals(run.get("status")), "the run is " + run.get("status") + ", not failed");
        Map<?, ?> failure = (Map<?, ?>) run.get("failure");
        check(failure != null && failure.get("cause") instanceof Map, "not an activity's failure: " + failure);
        return (Map<?, ?>) failure.get("cause");
    }

    static void check(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError(what);
        }
    }

    /** A worker's options for the tests: dex web, its token, short polls and backoffs. */
    static Worker.Options options(String id) {
        return Worker.Options.of(URL)
                .withToken(TOKEN)
                .withWorkerId("java-test-" + id)
                .withPollWait(Duration.ofSeconds(2))
                .withBackoff(Duration.ofMillis(200), Duration.ofSeconds(1))
                .withLog(line -> System.out.println(id + " " + line));
    }

    /** Runs the worker on a thread of its own; the thread ends when run() does. */
    static Thread background(Worker worker, List<Throwable> errors) {
        Thread thread = new Thread(() -> {
            try {
                worker.run();
            } catch (Exception e) {
                errors.add(e);
            }
        });
        thread.start();
        return thread;
    }

    /** Stops the worker and waits for run() to return. */
    static void stop(Worker worker, Thread thread) throws InterruptedException {
        worker.stop();
        thread.join(30_000);
        check(!thread.isAlive(), "the worker did not stop within 30 s");
    }
}
