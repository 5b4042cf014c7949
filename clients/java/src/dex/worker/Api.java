package dex.worker;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;

/** dex's remote-worker API: one JSON POST each, with the bearer token; refusals as {@link CallException}. */
final class Api {
    private final String base;
    private final String token;
    private final HttpClient client;

    Api(String base, String token, HttpClient client) {
        this.base = base.replaceAll("/+$", "");
        this.token = token;
        this.client = client;
    }

    String base() {
        return base;
    }

    /** The answer's JSON; a CallException for a refusal or no answer. */
    CompletableFuture<Object> post(String path, Object body, Duration timeout) {
        HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(base + path))
                .timeout(timeout)
                .header("Content-Type", "application/json")
                // Json writes ASCII only: what a Java string holds crosses exactly
                .POST(HttpRequest.BodyPublishers.ofString(Json.write(body), StandardCharsets.US_ASCII));
        if (token != null && !token.isEmpty()) {
            request.header("Authorization", "Bearer " + token);
        }
        return client.sendAsync(request.build(), HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8))
                .handle((response, error) -> {
                    if (error != null) {
                        Throwable cause = error instanceof CompletionException && error.getCause() != null
                                ? error.getCause()
                                : error;
                        throw new CompletionException(new CallException(path, 0, "NoAnswer", String.valueOf(cause), null));
                    }
                    return answer(path, response);
                });
    }

    /** The same, waiting for the answer. */
    Object call(String path, Object body, Duration timeout) throws CallException, InterruptedException {
        try {
            return post(path, body, timeout).get();
        } catch (java.util.concurrent.ExecutionException e) {
            if (e.getCause() instanceof CallException refused) {
                throw refused;
            }
            throw new CallException(path, 0, "NoAnswer", String.valueOf(e.getCause()), null);
        }
    }

    private static Object answer(String path, HttpResponse<String> response) {
        int status = response.statusCode();
        if (status / 100 == 2) {
            try {
                return Json.parse(response.body());
            } catch (IllegalArgumentException e) { // a proxy's page, or an answer cut short
                throw new CompletionException(new CallException(path, status, "BadAnswer", e.getMessage(), null));
            }
        }
        String type = "HTTP" + status;
        String message = response.body().length() > 200 ? response.body().substring(0, 200) : response.body();
        try {
            if (Json.parse(response.body()) instanceof Map<?, ?> document
                    && document.get("error") instanceof Map<?, ?> error
                    && error.get("type") instanceof String kind) {
                type = kind;
                message = String.valueOf(error.get("message"));
            }
        } catch (IllegalArgumentException notJson) {
            // not dex's error document: the start of the body says what it was
        }
        Duration retryAfter = response.headers().firstValue("Retry-After").map(Api::seconds).orElse(null);
        throw new CompletionException(new CallException(path, status, type, message.strip(), retryAfter));
    }

    private static Duration seconds(String value) {
        try {
            long seconds = Long.parseLong(value.strip());
            return seconds > 0 ? Duration.ofSeconds(seconds) : null;
        } catch (NumberFormatException e) {
            return null;
        }
    }

}
