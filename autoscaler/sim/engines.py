"""Pick the queueing engine for a fidelity mode."""

from __future__ import annotations

from autoscaler.sim.des import DesEngine
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.queueing import QueueEngine
from autoscaler.sim.workload import SimWorkload

MODES = ("fluid", "des")


def make_engine(mode: str, workload: SimWorkload, dt: float, seed: int = 0) -> QueueEngine:
    if mode == "fluid":
        return FluidEngine(workload.queue)
    if mode == "des":
        return DesEngine(workload.queue, seed=seed)
    raise ValueError(f"unknown simulator mode {mode!r} (known: {', '.join(MODES)})")
