"""Migration 19 (released): a rate-limited queue's start slots kept in shares, a row per group
of slots instead of a row per slot (docs/reference/contract.md §15).

Frozen: this text is what databases at version 19 were made with. It imports nothing; never
edit it (a change of schema is a new module). ``{s}`` is the schema, filled in by the runner as
a quoted identifier.

A queue limited to ``rate_count`` starts per period had ``rate_count`` rows in ``queue_starts``
(migration 15), and a claim of n tasks locked and stamped n of them: as much writing as the
claim of the tasks itself. Here slot ``i`` of a queue belongs to share ``i % greatest(1,
least(32, rate_count / 64))``; a share's row holds how many slots it has (``slots``) and their last starts that may
still count, as pairs (``recent[k]``, ``counts[k]``: ``counts[k]`` of its slots last started
at ``recent[k]``; a slot not among them is free). A claim locks one share (``FOR UPDATE SKIP
LOCKED``: concurrent claims take other shares, none waits) and stamps as many of its free
slots as it starts tasks with one pair. ``free_at`` is when the share's
first slot is free again (its oldest last start plus the period; ``-infinity`` while some slot
is free), which the claims order by and the due-time query reads.

The slots' last starts carry over: each kept stamp of ``queue_starts`` becomes a pair of its
slot's share, so the upgrade lets no burst through. ``queue_starts`` is dropped.
"""

VERSION = 19

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.queue_start_shares (
        kind text COLLATE "C" NOT NULL,
        queue text COLLATE "C" NOT NULL,
        share integer NOT NULL,
        slots integer NOT NULL CHECK (slots > 0),
        recent timestamptz[] NOT NULL DEFAULT ARRAY[]::timestamptz[],
        counts integer[] NOT NULL DEFAULT ARRAY[]::integer[],
        free_at timestamptz NOT NULL DEFAULT '-infinity',
        PRIMARY KEY (kind, queue, share)
    )
    """,
    "CREATE INDEX queue_start_shares_free ON {s}.queue_start_shares (kind, queue, free_at)",
    """
    INSERT INTO {s}.queue_start_shares (kind, queue, share, slots, recent, counts, free_at)
    SELECT g.kind, g.queue, g.share, sum(g.n)::integer,
           coalesce(array_agg(g.last_start ORDER BY g.last_start) FILTER (WHERE g.last_start > '-infinity'),
                    ARRAY[]::timestamptz[]),
           coalesce(array_agg(g.n::integer ORDER BY g.last_start) FILTER (WHERE g.last_start > '-infinity'),
                    ARRAY[]::integer[]),
           min(g.last_start) + g.rate_period_us * interval '1 microsecond'
    FROM (
        SELECT st.kind, st.queue, st.slot % greatest(1, least(32, qu.rate_count / 64)) AS share, st.last_start, qu.rate_period_us,
               count(*) AS n
        FROM {s}.queue_starts st JOIN {s}.queues qu ON qu.kind = st.kind AND qu.name = st.queue
        WHERE qu.rate_count IS NOT NULL AND st.slot < qu.rate_count
        GROUP BY st.kind, st.queue, st.slot % greatest(1, least(32, qu.rate_count / 64)), st.last_start, qu.rate_period_us
    ) g
    GROUP BY g.kind, g.queue, g.share, g.rate_period_us
    """,
    "DROP TABLE {s}.queue_starts",
    """
    CREATE FUNCTION {s}.share_free(recent timestamptz[], counts integer[], slots integer, cutoff timestamptz)
    RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
    DECLARE
        used integer := 0;
    BEGIN
        FOR k IN 1 .. coalesce(array_length(recent, 1), 0) LOOP
            IF recent[k] > cutoff THEN
                used := used + counts[k];
            END IF;
        END LOOP;
        RETURN greatest(slots - used, 0);
    END
    $$
    """,
    """
    CREATE FUNCTION {s}.share_stamped(
        recent timestamptz[], counts integer[], slots integer, cutoff timestamptz, at timestamptz, n integer,
        period interval, OUT kept_recent timestamptz[], OUT kept_counts integer[], OUT free_at timestamptz
    ) LANGUAGE plpgsql IMMUTABLE AS $$
    DECLARE
        total integer := 0;
        oldest timestamptz := 'infinity';
    BEGIN
        kept_recent := ARRAY[]::timestamptz[];
        kept_counts := ARRAY[]::integer[];
        FOR k IN 1 .. coalesce(array_length(recent, 1), 0) LOOP
            IF recent[k] > cutoff THEN
                kept_recent := kept_recent || recent[k];
                kept_counts := kept_counts || counts[k];
                total := total + counts[k];
                oldest := least(oldest, recent[k]);
            END IF;
        END LOOP;
        IF n > 0 THEN
            kept_recent := kept_recent || at;
            kept_counts := kept_counts || n;
            total := total + n;
            oldest := least(oldest, at);
        END IF;
        free_at := CASE WHEN total < slots THEN '-infinity'::timestamptz ELSE oldest + period END;
    END
    $$
    """,
)
