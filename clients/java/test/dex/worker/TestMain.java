package dex.worker;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

/**
 * The tests' runner (no JUnit): runs every test at once (each has activity names of its own),
 * prints PASS or FAIL for each, and exits 1 if any failed.
 */
public final class TestMain {
    interface Check {
        void run() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        if (Dex.URL.isEmpty()) {
            System.out.println("SKIP: DEX_URL is not set: the tests need a real dex web (tests/remote/test_sdk_java.py serves one)");
            return;
        }
        Map<String, Check> tests = new LinkedHashMap<>();
        JsonTests.register(tests);
        WorkerTests.register(tests);
        OutageTests.register(tests);
        ExecutorService pool = Executors.newCachedThreadPool();
        Map<String, Future<Throwable>> running = new LinkedHashMap<>();
        for (Map.Entry<String, Check> test : tests.entrySet()) {
            running.put(test.getKey(), pool.submit(() -> {
                try {
                    test.getValue().run();
                    return null;
                } catch (Throwable failed) {
                    return failed;
                }
            }));
        }
        List<String> failed = new ArrayList<>();
        for (Map.Entry<String, Future<Throwable>> test : running.entrySet()) {
            Throwable outcome;
            try {
                outcome = test.getValue().get(120, TimeUnit.SECONDS);
            } catch (java.util.concurrent.TimeoutException e) {
                outcome = new AssertionError("did not end within 120 s");
            }
            if (outcome == null) {
                System.out.println("PASS " + test.getKey());
            } else {
                failed.add(test.getKey());
                System.out.println("FAIL " + test.getKey());
                outcome.printStackTrace(System.out);
            }
        }
        pool.shutdownNow();
        System.out.println(failed.isEmpty() ? "ALL PASSED (" + tests.size() + ")" : "FAILED: " + failed);
        System.exit(failed.isEmpty() ? 0 : 1);
    }
}
