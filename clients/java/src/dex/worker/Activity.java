package dex.worker;

import java.util.List;

/**
 * One activity, run for each of its tasks on a thread of the worker's pool.
 *
 * <p>{@code args} are the workflow's arguments to {@code ctx.activity} as {@link Json} reads them;
 * the result is written with {@link Json#write}. Throw an {@link ActivityError} to choose the
 * type dex records, to fail for good or to ask for a retry after a delay; any other exception
 * is retried under the activity's retry policy, with its class's simple name as the type.
 */
@FunctionalInterface
public interface Activity {
    Object run(ActivityContext context, List<Object> args) throws Exception;
}
