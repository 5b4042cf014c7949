package dex.worker;

import java.time.Duration;

/** A worker in a JVM of its own, for the SIGTERM test: one activity that takes a second. */
public final class SignalWorker {
    private SignalWorker() {}

    public static void main(String[] args) throws Exception {
        Worker worker = new Worker(Dex.options("sigterm").withLog(System.out::println).withPollWait(Duration.ofSeconds(1)))
                .register("java-sigterm", (context, arguments) -> {
                    System.out.println("started");
                    Thread.sleep(1000);
                    return "finished";
                });
        worker.runUntilShutdown();
    }
}
