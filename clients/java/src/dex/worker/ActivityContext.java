package dex.worker;

import java.util.concurrent.atomic.AtomicReference;

/**
 * The task an activity runs, and whether it should stop: {@link #cancelled()} turns true once
 * dex answered a heartbeat with {@code cancel_requested} (the run was cancelled or ended) or the
 * attempt's lease was lost; the activity's thread is interrupted then too. Whatever the activity
 * returns afterwards is not recorded.
 */
public final class ActivityContext {
    private final Task task;
    private final AtomicReference<String> ended = new AtomicReference<>();

    ActivityContext(Task task) {
        this.task = task;
    }

    public Task task() {
        return task;
    }

    public boolean cancelled() {
        return ended.get() != null;
    }

    /** "cancelled" or "lost" once it ended; null while it holds. */
    String ended() {
        return ended.get();
    }

    /** True the first time only. */
    boolean end(String why) {
        return ended.compareAndSet(null, why);
    }
}
