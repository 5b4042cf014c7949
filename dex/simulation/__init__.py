"""Deterministic simulation of a dex cluster: many nodes, one thread, faults, invariants.

``Simulator(seed, faults).run()`` drives several engines over one in-memory store on a
virtual clock, interleaving their steps as ``random.Random(seed)`` says and injecting the
scheduled faults; it raises :class:`SimulationFailure` (naming the seed and the schedule to
replay) when an invariant breaks.

``simulator.py`` runs the loop; ``nodes.py`` holds the simulated engines and the work they
hold; ``clients.py`` starts runs and sends requests; ``faults.py`` says what can go wrong;
``workload.py`` holds the workflows and activities simulated (``chain_workload.py``,
``ledger_workload.py`` and ``conversation_workload.py`` add to them); ``observed.py`` is the store,
reporting every call to ``referee.py``, which checks it; ``invariants.py`` (one history) and
``ledgers.py`` (grants over time) say what must hold.
"""

from dex.simulation.faults import FAULT_KINDS, Fault
from dex.simulation.invariants import InvariantViolation
from dex.simulation.observed import ObservedAdapter, StoreUnavailable
from dex.simulation.referee import Referee
from dex.simulation.simulator import Report, SimulationFailure, Simulator
from dex.simulation.workload import STANDARD_WORKLOAD, Workload

__all__ = [
    "FAULT_KINDS",
    "STANDARD_WORKLOAD",
    "Fault",
    "InvariantViolation",
    "ObservedAdapter",
    "Referee",
    "Report",
    "SimulationFailure",
    "Simulator",
    "StoreUnavailable",
    "Workload",
]
