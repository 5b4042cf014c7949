"""The PostgreSQL adapter's one rule for array parameters (dex.adapters.postgres.arrays): every
array goes in binary and names its type, ``%b::type[]`` (or ``%(name)b::type[]``).

The adapter's SQL is read from its source: a placeholder cast to an array type, compared with
``ANY``/``ALL`` or unnested must be a binary one with the array's type named. A ``%s`` array
lets psycopg pick the format and PostgreSQL guess the type (an empty list is ``unknown[]``),
which is what the rule is there to rule out. The direct start statement's ``$16`` (libpq, text
form; see arrays.py) is not a psycopg placeholder and is not read here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dex.adapters.postgres

ADAPTER = Path(dex.adapters.postgres.__file__).parent
# the modules that send statements with parameters (migrations run fixed DDL; arrays.py is the rule)
MODULES = sorted(p for p in ADAPTER.glob("*.py") if p.name not in {"arrays.py", "__init__.py"})

_PLACEHOLDER = r"%(?:\(\w+\))?[a-z]"
# a placeholder cast to an array type: it must be binary
_CAST = re.compile(rf"({_PLACEHOLDER})::[a-z0-9_ ]+\[\]")
# a placeholder compared with ANY/ALL: it must be binary with its array type named
_QUANTIFIED = re.compile(rf"\b(?:ANY|ALL)\(\s*({_PLACEHOLDER})(::[a-z0-9_ ]+\[\])?", re.IGNORECASE)
# the arguments of an unnest of parameters: each a binary placeholder with its array type named
_UNNEST = re.compile(r"\bunnest\(([^()]*%[^()]*)\)", re.IGNORECASE)
_ARGUMENT = re.compile(r"^\s*%(?:\(\w+\))?b::[a-z0-9_ ]+\[\]\s*$")


def _binary(placeholder: str) -> bool:
    return placeholder.endswith("b")


def violations(source: str) -> list[str]:
    """The array parameters in ``source`` that do not follow the rule (each with its text)."""
    found = []
    for match in _CAST.finditer(source):
        if not _binary(match.group(1)):
            found.append(match.group(0))
    for match in _QUANTIFIED.finditer(source):
        if not _binary(match.group(1)) or match.group(2) is None:
            found.append(match.group(0))
    # the arguments of one unnest may be spread over adjacent string literals: join them first
    joined = re.sub(r"\"\s*\n\s*\"", "", source)
    for match in _UNNEST.finditer(joined):
        for argument in match.group(1).split(","):
            if "%" in argument and not _ARGUMENT.match(argument):
                found.append(f"unnest(... {argument.strip()} ...)")
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_every_array_parameter_of_the_adapter_follows_the_rule(module: Path) -> None:
    assert violations(module.read_text()) == []


def test_the_adapter_sends_array_parameters_the_check_reads() -> None:
    # the check reads the SQL it is meant to read (a rename of the modules would empty it)
    arrays_seen = sum(len(_CAST.findall(module.read_text())) for module in MODULES)
    assert arrays_seen > 40


@pytest.mark.parametrize(
    "sql",
    [
        "WHERE run_id = ANY(%s)",
        "WHERE t.name = ANY(%(names)s)",
        "WHERE run_id = ANY(%b)",  # binary, but the type left to a guess
        "kind <> ALL(%s::text[])",
        "SELECT %s::text[]",
        "FROM unnest(%(queues)s::text[], %(ids)b::bigint[]) AS r(queue, task_id)",
        '" FROM unnest(%b::text[],"\n            " %s) AS r(a, b)"',
    ],
)
def test_the_check_finds_an_array_sent_another_way(sql: str) -> None:
    assert violations(sql) != []


@pytest.mark.parametrize(
    "sql",
    [
        "WHERE run_id = ANY(%b::text[])",
        "WHERE t.name = ANY(%(names)b::text[]) AND t.due <= %(now)s",
        "FROM unnest(%(queues)b::text[], %(ids)b::bigint[]) AS r(queue, task_id)",
        '" FROM unnest(%b::text[],"\n            " %b::timestamptz[]) AS r(a, b)"',
        "log.warning('psycopg %s is outside the range (%s to %s)', a, b, c)",
    ],
)
def test_the_check_passes_an_array_sent_by_the_rule(sql: str) -> None:
    assert violations(sql) == []
