package dex.worker;

import java.time.Duration;

/**
 * A call to dex that did not get a 2xx answer: dex's {@code {"error": {type, message}}} with the
 * HTTP status, or (status 0) no answer at all (refused, cut off, timed out).
 */
public class CallException extends Exception {
    private static final long serialVersionUID = 1L;

    private final String path;
    private final int status;
    private final String type;
    private final Duration retryAfter;

    public CallException(String path, int status, String type, String message, Duration retryAfter) {
        super(status == 0 ? path + ": no answer: " + message : path + ": " + status + " " + type + ": " + message);
        this.path = path;
        this.status = status;
        this.type = type;
        this.retryAfter = retryAfter;
    }

    public String path() {
        return path;
    }

    public int status() {
        return status;
    }

    public String type() {
        return type;
    }

    /** A 503's Retry-After, or null. */
    public Duration retryAfter() {
        return retryAfter;
    }

    /** Whether calling again may succeed: no answer, an answer that is not dex's (a proxy's page), a 5xx, a 429. */
    public boolean isTransient() {
        return status == 0 || "BadAnswer".equals(type) || status >= 500 || status == 429;
    }
}
