package dex.worker;

import java.time.Duration;

/** An activity's failure as dex records it: its type and message, whether it is final, when to retry. */
public class ActivityError extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final String type;
    private final boolean terminal;
    private final Duration retryAfter;

    /** {@code retryAfter}: null for the retry policy's delay. */
    public ActivityError(String type, String message, boolean terminal, Duration retryAfter) {
        super(message);
        this.type = type == null || type.isEmpty() ? "Error" : type; // dex refuses an empty type
        this.terminal = terminal;
        this.retryAfter = retryAfter;
    }

    /** A failure that is not retried: the workflow's {@code ctx.activity} raises at once. */
    public static ActivityError terminal(String type, String message) {
        return new ActivityError(type, message, true, null);
    }

    /** A failure retried after {@code delay} (when the retry policy has attempts left). */
    public static ActivityError retryAfter(String type, String message, Duration delay) {
        return new ActivityError(type, message, false, delay);
    }

    public String type() {
        return type;
    }

    public boolean terminal() {
        return terminal;
    }

    public Duration retryAfter() {
        return retryAfter;
    }
}
