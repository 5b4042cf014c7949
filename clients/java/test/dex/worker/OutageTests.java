package dex.worker;

import static dex.worker.Dex.await;
import static dex.worker.Dex.background;
import static dex.worker.Dex.check;
import static dex.worker.Dex.expectResult;
import static dex.worker.Dex.options;
import static dex.worker.Dex.start;
import static dex.worker.Dex.stop;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/** The server answering 500 or going away, and SIGTERM to a worker's JVM. */
final class OutageTests {
    private OutageTests() {}

    static void register(Map<String, TestMain.Check> tests) {
        tests.put("failedCallsAreRetriedWithBackoffAndTheWorkerRecovers", OutageTests::outage);
        tests.put("sigtermDrainsTheTaskInFlightBeforeTheJvmExits", OutageTests::sigterm);
    }

    static final int FORWARD = 0;
    static final int ANSWER_500 = 1;
    static final int HANG_UP = 2;
    static final int NOT_DEX = 3; // a 200 with a page that is not dex's answer (a captive proxy)

    /** A proxy in front of dex web that can fail every call, hang up on it, answer what is not dex's, or fail the next complete. */
    static final class Proxy {
        final AtomicInteger mode = new AtomicInteger(FORWARD);
        final AtomicInteger calls = new AtomicInteger(); // while not forwarding
        final AtomicInteger failCompletes = new AtomicInteger();
        final AtomicInteger failedCompletes = new AtomicInteger();
        final HttpClient upstream = HttpClient.newHttpClient();
        final HttpServer server;

        Proxy() throws Exception {
            server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            server.setExecutor(Executors.newCachedThreadPool()); // long polls wait side by side
            server.createContext("/", this::handle);
            server.start();
        }

        String url() {
            return "http://127.0.0.1:" + server.getAddress().getPort();
        }

        void handle(HttpExchange exchange) throws java.io.IOException {
            byte[] body = exchange.getRequestBody().readAllBytes();
            int current = mode.get();
            if (current == ANSWER_500) {
                calls.incrementAndGet();
                answer(exchange, 500, "upstream exploded".getBytes(StandardCharsets.UTF_8));
                return;
            }
            if (current == NOT_DEX) {
                calls.incrementAndGet();
                answer(exchange, 200, "<html>please sign in</html>".getBytes(StandardCharsets.UTF_8));
                return;
            }
            if (current == HANG_UP) {
                calls.incrementAndGet();
                exchange.close(); // no status line: the worker's call gets no answer
                return;
            }
            String path = exchange.getRequestURI().getPath();
            if (path.endsWith("/complete") && failCompletes.getAndDecrement() > 0) {
                failedCompletes.incrementAndGet();
                answer(exchange, 500, "{\"error\": {\"type\": \"InternalError\", \"message\": \"the call failed inside dex\"}}"
                        .getBytes(StandardCharsets.UTF_8));
                return;
            }
            HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(Dex.URL + exchange.getRequestURI()))
                    .method(exchange.getRequestMethod(), HttpRequest.BodyPublishers.ofByteArray(body));
            for (String header : List.of("Authorization", "Content-Type")) {
                String value = exchange.getRequestHeaders().getFirst(header);
                if (value != null) {
                    request.header(header, value);
                }
            }
            try {
                HttpResponse<byte[]> response = upstream.send(request.build(), HttpResponse.BodyHandlers.ofByteArray());
                answer(exchange, response.statusCode(), response.body());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                exchange.close();
            }
        }

        static void answer(HttpExchange exchange, int status, byte[] body) throws java.io.IOException {
            exchange.getResponseHeaders().set("Content-Type", "application/json");
            exchange.sendResponseHeaders(status, body.length);
            exchange.getResponseBody().write(body);
            exchange.close();
        }
    }

    static void outage() throws Exception {
        Proxy proxy = new Proxy();
        Worker worker = new Worker(options("outage").withUrl(proxy.url())).register("java-outage", WorkerTests::echo);
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        Thread thread = background(worker, errors);
        try {
            for (int mode : new int[] {ANSWER_500, HANG_UP, NOT_DEX}) {
                proxy.calls.set(0);
                proxy.mode.set(mode);
                Thread.sleep(2000);
                proxy.mode.set(FORWARD);
                // backing off 0.2, 0.4, 0.8, 1, 1 s: about five polls in 2 s; a hot loop makes thousands
                int calls = proxy.calls.get();
                check(calls >= 2 && calls <= 8, "mode " + mode + ": " + calls + " polls in 2 s");
            }
            // back to health, and the first complete answered 500: it is sent again and recorded once
            proxy.failCompletes.set(1);
            expectResult(await(start("java-outage", "[\"after the outage\"]", 1), 20), "after the outage");
            check(proxy.failedCompletes.get() == 1, proxy.failedCompletes.get() + " completes failed by the proxy, want 1");
        } finally {
            stop(worker, thread);
            proxy.server.stop(0);
        }
        check(errors.isEmpty(), "run() failed: " + errors);
    }

    static void sigterm() throws Exception {
        String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
        Process child = new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"), "dex.worker.SignalWorker")
                .redirectErrorStream(true)
                .start();
        try (BufferedReader output = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8))) {
            String runId = start("java-sigterm", "[]", 1);
            List<String> lines = new ArrayList<>();
            String line;
            while ((line = output.readLine()) != null && !line.equals("started")) {
                lines.add(line);
            }
            check("started".equals(line), "the child did not start the task: " + lines);
            child.toHandle().destroy(); // SIGTERM (Process.destroy would also close the pipe we read)
            while ((line = output.readLine()) != null) {
                lines.add(line);
            }
            check(child.waitFor(20, TimeUnit.SECONDS), "the child did not exit");
            // 143: the JVM's status after SIGTERM, once its shutdown hooks (the drain) returned
            check(child.exitValue() == 143, "exit status " + child.exitValue() + ": " + lines);
            check(lines.stream().anyMatch(text -> text.contains("java-sigterm attempt 1: completed")), "child: " + lines);
            expectResult(await(runId, 10), "finished");
        } finally {
            child.destroyForcibly();
        }
    }
}
