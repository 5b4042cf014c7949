package dex.worker;

import java.util.List;
import java.util.Map;

/** An activity task as the poll handed it out. */
public record Task(
        long taskId,
        String runId,
        String name,
        int attempt,
        List<Object> args,
        long leaseVersion,
        String leaseUntil,
        double heartbeatTimeout) {

    @SuppressWarnings("unchecked")
    static Task of(Object json) {
        if (!(json instanceof Map<?, ?> fields)) {
            throw new IllegalArgumentException("a task is a JSON object, not " + json);
        }
        Object args = fields.get("args");
        return new Task(
                ((Number) fields.get("task_id")).longValue(),
                (String) fields.get("run_id"),
                (String) fields.get("name"),
                ((Number) fields.get("attempt")).intValue(),
                args instanceof List<?> list ? (List<Object>) list : List.of(),
                ((Number) fields.get("lease_version")).longValue(),
                (String) fields.get("lease_until"),
                ((Number) fields.get("heartbeat_timeout")).doubleValue());
    }
}
