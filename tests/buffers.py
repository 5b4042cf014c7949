"""A stand-in for what a started engine gives its write buffer, for tests of the buffer alone."""

from __future__ import annotations


class Flushers:
    """A started engine's dispatch as the buffer sees it: active (its flushers write), claiming
    nothing."""

    def active(self) -> bool:
        return True

    def activity_claim(self) -> None:
        return None

    def activities_claimed(self, claim: object, tasks: object) -> None:
        pass

    def workflow_claim(self, run_ids: object) -> None:
        return None

    def start_claim(self) -> None:
        return None

    def workflows_claimed(self, tasks: object, loaded: object = None, now: object = None) -> None:
        pass
