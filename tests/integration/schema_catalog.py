"""A schema as the catalogs describe it, as text: what the migrations made, not what they say.

:func:`describe_schema` reads ``pg_catalog`` for one schema and writes one line per object:
relations (kind, persistence, partition key), columns (type, collation, nullability, default,
identity, generated), constraints, indexes, sequences (with the column that owns them),
functions (their whole definitions), triggers and views, each sorted by name. The schema's
name becomes ``{s}``, so two schemas made alike describe alike. Partitions are left out (the
live code makes them per queue; they copy their parent), so a database that holds queues
describes as an empty one.

``tests/integration/test_migrations.py`` compares the description of a new schema with the
committed ``schema_snapshot.txt``.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg

RELKINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view", "f": "foreign table"}


def describe_schema(conn: psycopg.Connection, schema: str) -> str:
    """The objects of ``schema`` as text, one line each (and a function's definition after it)."""
    text = "\n".join(_lines(conn, schema)) + "\n"
    # quoted first: function bodies name the schema as psycopg's sql.Identifier wrote it
    quoted = '"' + schema.replace('"', '""') + '"'
    return text.replace(quoted, "{s}").replace(schema, "{s}")


def _lines(conn: psycopg.Connection, schema: str) -> Iterator[str]:
    (oid,) = _one(conn, "SELECT oid FROM pg_namespace WHERE nspname = %s", [schema])
    relations = conn.execute(
        "SELECT c.oid, c.relname, c.relkind, c.relpersistence, pg_get_partkeydef(c.oid)"
        " FROM pg_class c WHERE c.relnamespace = %s AND c.relkind = ANY(%s) AND NOT c.relispartition"
        " ORDER BY c.relname",
        [oid, list(RELKINDS)],
    ).fetchall()
    for relid, name, kind, persistence, partition_key in relations:
        persistence = {"p": "", "u": " unlogged", "t": " temporary"}[persistence]
        by = f" partition by {partition_key}" if partition_key else ""
        yield f"{RELKINDS[kind]} {name}{persistence}{by}"
        yield from _columns(conn, relid)
        yield from _constraints(conn, relid)
        yield from _indexes(conn, relid)
        yield from _triggers(conn, relid)
        if kind in "vm":
            yield "  definition " + " ".join(_one(conn, "SELECT pg_get_viewdef(%s)", [relid])[0].split())
    yield from _sequences(conn, oid)
    yield from _functions(conn, oid)


def _columns(conn: psycopg.Connection, relid: int) -> Iterator[str]:
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), co.collname, a.attnotnull,"
        " pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated"
        " FROM pg_attribute a"
        " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100"  # 100: default
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [relid],
    ).fetchall()
    for name, type_, collation, not_null, default, identity, generated in rows:
        line = f"  column {name} {type_}"
        if collation:
            line += f' collate "{collation}"'
        if not_null:
            line += " not null"
        if identity:
            line += " generated " + {"a": "always", "d": "by default"}[identity] + " as identity"
        elif generated:
            line += f" generated always as ({default}) stored"
        elif default is not None:
            line += f" default {default}"
        yield line


def _constraints(conn: psycopg.Connection, relid: int) -> Iterator[str]:
    # not-null constraints ('n', listed from PostgreSQL 18 on) are the columns' "not null"
    rows = conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s AND contype <> 'n' ORDER BY conname",
        [relid],
    ).fetchall()
    for name, definition in rows:
        yield f"  constraint {name} {definition}"


def _indexes(conn: psycopg.Connection, relid: int) -> Iterator[str]:
    rows = conn.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = %s ORDER BY c.relname",
        [relid],
    ).fetchall()
    for name, definition in rows:
        yield f"  index {name} {definition}"


def _triggers(conn: psycopg.Connection, relid: int) -> Iterator[str]:
    rows = conn.execute(
        "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal ORDER BY tgname",
        [relid],
    ).fetchall()
    for name, definition in rows:
        yield f"  trigger {name} {definition}"


def _sequences(conn: psycopg.Connection, namespace: int) -> Iterator[str]:
    rows = conn.execute(
        "SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,"
        " s.seqcache, s.seqcycle, owner.relname, a.attname"
        " FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid"
        " LEFT JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid"
        "  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')"
        " LEFT JOIN pg_class owner ON owner.oid = d.refobjid"
        " LEFT JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid"
        " WHERE c.relnamespace = %s ORDER BY c.relname",
        [namespace],
    ).fetchall()
    for name, type_, start, increment, minimum, maximum, cache, cycle, table, column in rows:
        owned = f" owned by {table}.{column}" if table else ""
        yield (
            f"sequence {name} {type_} start {start} increment {increment} min {minimum} max {maximum}"
            f" cache {cache}{' cycle' if cycle else ''}{owned}"
        )


def _functions(conn: psycopg.Connection, namespace: int) -> Iterator[str]:
    rows = conn.execute(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)"
        " FROM pg_proc p WHERE p.pronamespace = %s ORDER BY p.proname, 2",
        [namespace],
    ).fetchall()
    for name, arguments, definition in rows:
        yield f"function {name}({arguments})"
        # the whole text, body and all: a change to a comment inside a body is a change too
        yield from (("  | " + line).rstrip() for line in definition.rstrip("\n").split("\n"))


def _one(conn: psycopg.Connection, query: str, params: list[object]) -> tuple[object, ...]:
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return tuple(row)
