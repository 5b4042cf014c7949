"""Engine(code_version=) on every adapter (docs/reference/contract.md §11): each run records the version of the
engine that started it, list_runs filters by it, and @dex.workflow(version=) is retired."""

from __future__ import annotations

from typing import Any

import pytest

import dex


@dex.workflow(name="versioned_child")
async def versioned_child(ctx: dex.WorkflowContext) -> str:
    return "child"


@dex.workflow(name="versioned_parent")
async def versioned_parent(ctx: dex.WorkflowContext) -> str:
    return await ctx.child(versioned_child)  # type: ignore[no-any-return]


def test_each_run_records_the_code_version_of_the_engine_that_started_it(make_engine: Any) -> None:
    v1 = make_engine([versioned_parent, versioned_child], code_version="2026.11.1")
    v2 = make_engine([versioned_parent, versioned_child], code_version="2026.11.2")
    unnamed = make_engine([versioned_parent, versioned_child])
    first = v1.start_workflow(versioned_parent)
    second = v2.start_workflow(versioned_parent)
    third = unnamed.start_workflow(versioned_parent)
    v2.drain()  # the v2 engine runs them all: a version names who started a run, not who ran it
    for run_id in (first, second, third):
        assert v2.wait(run_id, timeout=5) == "child"
    assert v2.get_run(first).code_version == "2026.11.1"
    assert v2.get_run(second).code_version == "2026.11.2"
    assert v2.get_run(third).code_version is None
    # a child carries the version of the run that started it
    children = {info.parent_run_id: info for info in v2.list_runs(workflow_name="versioned_child")}
    assert children[first].code_version == "2026.11.1"
    assert children[third].code_version is None
    listed = v2.list_runs(code_version="2026.11.1")
    assert {info.run_id for info in listed} == {first, children[first].run_id}
    assert [info.run_id for info in v2.list_runs(code_version="2026.11.2", workflow_name="versioned_parent")] == [
        second
    ]
    assert v2.list_runs(code_version="never-deployed") == []


@pytest.mark.parametrize(
    ("version", "error"),
    [
        ("bad\x00version", ValueError),
        ("bad\ud800version", ValueError),
        ("", ValueError),
        ("x" * 257, ValueError),
        (7, TypeError),
    ],
)
def test_a_bad_code_version_is_refused_where_it_enters(make_engine: Any, version: Any, error: type) -> None:
    with pytest.raises(error, match="code_version"):
        make_engine([versioned_child], code_version=version)
    healthy = make_engine([versioned_child], code_version="ok")
    with pytest.raises(error, match="code_version"):
        healthy.list_runs(code_version=version)
    run_id = healthy.start_workflow(versioned_child)
    healthy.drain()
    assert healthy.wait(run_id, timeout=5) == "child"
    assert healthy.get_run(run_id).code_version == "ok"


def test_the_workflow_version_option_is_retired_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"code_version"):

        @dex.workflow(name="old_style", version=2)
        async def old_style(ctx: dex.WorkflowContext) -> None:
            return None

    assert not hasattr(old_style.__dex_workflow__, "version")  # type: ignore[attr-defined]
