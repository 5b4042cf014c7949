"""Command matching: where replay stands in the workflow-task block it applies.

A recorded block's command events are matched, in order, against the commands the replayed
workflow code issues; a difference (or a step the history does not have, or one it has that the
code never asked for) is a non-determinism, described in words that name both steps. For the
block being decided now there is no record: each command gets the next sequence number and is
kept as new. The executor (``dex.domain.replay``) owns one :class:`BlockCursor` and resets it
for every block.
"""

from __future__ import annotations

from collections.abc import Sequence

from dex.domain import commands as cmd
from dex.domain import events as ev


class BlockCursor:
    """The command position in one block: matched against ``recorded``, or numbered as new."""

    def __init__(self) -> None:
        # the text of the first non-determinism found, which the executor reads when a command
        # is refused or a block ends (kept here rather than reported through a callback to the
        # executor, which would tie the two in a cycle only the garbage collector can free)
        self.mismatch: str | None = None
        self.recorded: Sequence[ev.HistoryEvent] | None = None
        self.position = 0
        self.next_seq = 0
        self.new: list[tuple[int, cmd.Command]] = []

    def begin(self, recorded: Sequence[ev.HistoryEvent] | None, next_seq: int) -> None:
        """Start a block: replaying ``recorded``, or (None) deciding new commands from ``next_seq``."""
        self.recorded, self.position, self.next_seq, self.new = recorded, 0, next_seq, []

    @property
    def deciding(self) -> bool:
        """True for the block being decided now (its commands are new), False while replaying."""
        return self.recorded is None

    def issue(self, command: cmd.Command) -> tuple[int, ev.Event] | None:
        """Record a command: match it against history when replaying, else number it as new.

        Returns the command's sequence number and event, or None on a mismatch (reported)."""
        if self.recorded is None:
            seq = self.next_seq
            self.next_seq += 1
            self.new.append((seq, command))
            return seq, cmd.to_event(command)
        if self.position >= len(self.recorded):
            self._found(
                f"the workflow code asked for {cmd.describe_command(command)} where history recorded no further step"
            )
            return None
        recorded = self.recorded[self.position]
        difference = cmd.matches(command, recorded.event)
        if difference is not None:
            detail = "" if difference == "step" else f" with a different {difference}"
            self._found(
                f"history recorded {cmd.describe_event(recorded.event)} at event {recorded.sequence_number} "
                f"but the workflow code asked for {cmd.describe_command(command)}{detail}"
            )
            return None
        self.position += 1
        return recorded.sequence_number, recorded.event

    def take_patch(self, patch_id: str) -> bool:
        """While replaying: consume a ``PatchApplied(patch_id)`` recorded at this point, if there is one.

        Deciding, or where the record has another step (or none), nothing is consumed."""
        if self.recorded is None or self.position >= len(self.recorded):
            return False
        event = self.recorded[self.position].event
        if isinstance(event, ev.PatchApplied) and event.patch_id == patch_id:
            self.position += 1
            return True
        return False

    def check_all_asked(self) -> None:
        """At the end of a replayed block: report a recorded step the code did not ask for."""
        if self.recorded is not None and self.position < len(self.recorded):
            missing = self.recorded[self.position]
            self._found(
                f"history recorded {cmd.describe_event(missing.event)} at event {missing.sequence_number} "
                "but the workflow code did not ask for it"
            )

    def _found(self, text: str) -> None:
        if self.mismatch is None:
            self.mismatch = text

    def peek_seq(self) -> int:
        """The sequence number the next command will have (-1 past the end of a recorded block)."""
        if self.recorded is None:
            return self.next_seq
        if self.position < len(self.recorded):
            return self.recorded[self.position].sequence_number
        return -1
