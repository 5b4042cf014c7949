"""A saga: book a trip in three steps, and undo what was done when a step fails or the trip is
cancelled (docs/reference/contract.md §14).

Each step that succeeded pushes its compensation; when a later step fails, or the run is
cancelled (``engine.cancel``, or its deadline passes: ``start_workflow(timeout=)``), the
compensations run in reverse order, live and recorded, before the run ends. ``dex.CancelledError``
is a ``BaseException``: ``except Exception`` would not catch it, so the saga catches both.

    python examples/saga.py

runs three trips on an in-memory store with a virtual clock: one that completes, one whose car
rental fails, and one cancelled while it waits for the customer's confirmation, and prints
what each did.
"""

from __future__ import annotations

from datetime import timedelta

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock

NO_RETRY = dex.RetryPolicy(max_attempts=1)


@dex.activity(name="saga-book-flight")
def book_flight(trip: str) -> str:
    return f"flight-{trip}"


@dex.activity(name="saga-book-hotel")
def book_hotel(trip: str) -> str:
    return f"hotel-{trip}"


@dex.activity(name="saga-rent-car", retry=NO_RETRY)
def rent_car(trip: str) -> str:
    if trip.startswith("no-car"):
        raise RuntimeError("no car left")
    return f"car-{trip}"


@dex.activity(name="saga-undo")
def undo(booking: str) -> str:
    return f"cancelled {booking}"


@dex.workflow(name="saga-trip")
async def trip(ctx: dex.WorkflowContext, name: str) -> list[str]:
    done: list[str] = []  # what to undo, in the order it was done
    try:
        done.append(await ctx.activity(book_flight, name))
        done.append(await ctx.activity(book_hotel, name))
        done.append(await ctx.activity(rent_car, name))
        await ctx.wait_for_event("confirmed", timeout=timedelta(days=1))
        return done
    except (Exception, dex.CancelledError):
        # compensate, newest first; a cancelled run's cleanup steps run too, and are recorded
        for booking in reversed(done):
            await ctx.activity(undo, booking)
        raise


def main() -> dict[str, tuple[str, list[str]]]:
    """Run the three trips; each one's end status and the activities it ran, in order."""
    clock = VirtualClock()
    engine = dex.Engine(
        InMemoryAdapter(clock=clock), workflows=[trip], activities=[book_flight, book_hotel, rent_car, undo]
    )
    runs = {name: engine.start_workflow(trip, name) for name in ("happy", "no-car", "cancelled")}
    engine.drain(advance_time=False)
    engine.send_event(runs["happy"], "confirmed")
    engine.cancel(runs["cancelled"], "the customer changed their mind")
    engine.drain(advance_time=False)
    outcome = {}
    for name, run_id in runs.items():
        steps = [f"{step.name}={step.status}" for step in engine.activity_steps(run_id)]
        outcome[name] = (engine.get_run(run_id).status.value, steps)
    engine.stop()
    return outcome


if __name__ == "__main__":
    for name, (status, steps) in main().items():
        print(f"{name:10} {status:10} {' -> '.join(steps)}")
