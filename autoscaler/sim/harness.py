"""Simulation runs as the CLI and the benchmarks set them up: the default cluster for a workload, a cluster spec
from a file or a string, every policy on the same workload side by side, each scored against the lower bound of
:mod:`autoscaler.sim.lower_bound` (and the oracle, which always runs: a second, named reference), and the shipped
scenarios. ``slotwise simulate`` and ``bench/*.py`` both call these, so a benchmark runs what the command runs."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from autoscaler.api.spec import ModelSpec
from autoscaler.policies import make_policy
from autoscaler.sim.lower_bound import lower_bound
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import SimWorkload, peak_replicas
from sharing.cluster import nodes_from_spec
from sharing.slots import NodeSpec

DEFAULT_TRACE = "azure-llm-2023"  # the demo's bundled trace
POLICY_ORDER = ("slotwise", "predictive", "hpa", "kpa", "static", "oracle")  # the scorecard's columns


def default_cluster(workload: SimWorkload, tick_s: float, headroom: float = 3.0) -> list[NodeSpec]:
    """A cluster of MIG-enabled H100-80GB nodes with room for every model at its peak plus headroom.

    The headroom is generous on purpose: reactive baselines overshoot the peak (HPA doubles, KPA panics),
    and a comparison where the cluster, not the policy, limits them would say little about the policies.
    GPU-hours count only what replicas hold, so unused nodes cost nothing in the scorecard.

    Each model's replica is placed once by the packer on an empty node to learn what one replica costs
    (a MIG slice, a share or whole GPUs), so the estimate follows the packer's real choices.
    """
    from autoscaler.api.spec import slot_request
    from sharing.packer import CostAwarePacker
    from sharing.slots import Inventory

    probe = nodes_from_spec("8xH100-80GB:mig")
    packer = CostAwarePacker()
    gpus = 0.0
    for name, n in peak_replicas(workload, tick_s).items():
        spec = workload.specs[name]
        if not isinstance(spec, ModelSpec) or n == 0:
            continue
        slot = packer.place(Inventory.from_nodes(probe), slot_request(spec))
        gpus += n * (slot.gpu_fraction if slot is not None else spec.gpus_per_replica)
    nodes = max(2, math.ceil(headroom * gpus / 8.0))
    return nodes_from_spec(f"{nodes * 8}xH100-80GB:mig")


def load_cluster(arg: str) -> list[NodeSpec]:
    """A cluster spec given inline or as a YAML file (see sharing/cluster.py for both grammars)."""
    if os.path.exists(arg):
        import yaml

        with open(arg) as f:
            try:
                doc = yaml.safe_load(f)
            except yaml.YAMLError as e:
                raise ValueError(f"{arg}: not valid YAML: {e}") from None
        return nodes_from_spec(doc)
    return nodes_from_spec(arg)


PROGRESS_STEP = 0.1  # without a terminal: a line every 10 % of a run ...
PROGRESS_EVERY_S = 30.0  # ... or every 30 s, whichever comes first
PROGRESS_QUIET_S = 2.0  # ... but 10 % lines at least 2 s apart: a run of a few seconds prints little more than 100 %


def progress_bar(label: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):  # type: ignore[no-untyped-def]
    """``(bar, callback)`` for a run's progress (the callback takes the fraction done). On a terminal a rich bar
    (``bar``: stop it when done); otherwise (CI, a log file) plain lines on stderr such as
    ``simulating slotwise: 40% (12 s)`` every 10 % or 30 s, and ``bar`` None -- a long run in a log shows it is
    alive, a short one prints one line."""
    out = stream if stream is not None else sys.stderr
    if not out.isatty():
        return None, _progress_lines(label, out, clock)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                   TimeElapsedColumn(), transient=True)
    task = bar.add_task(label, total=1.0)
    bar.start()
    return bar, (lambda f: bar.update(task, completed=f))


def _progress_lines(label: str, out: TextIO, clock: Callable[[], float]) -> Callable[[float], None]:
    start = clock()
    last_t, last_step, done = start, 0, False

    def report(fraction: float) -> None:
        nonlocal last_t, last_step, done
        if done:
            return
        now = clock()
        step = int(fraction / PROGRESS_STEP + 1e-9)
        done = fraction >= 1.0 - 1e-9
        new_step = step > last_step and now - last_t >= PROGRESS_QUIET_S
        if done or new_step or now - last_t >= PROGRESS_EVERY_S:
            print(f"{label}: {min(fraction, 1.0):.0%} ({now - start:.0f} s)", file=out, flush=True)
            last_t, last_step = now, step

    return report


def run_policies(
    workload: SimWorkload, nodes: list[NodeSpec], names: list[str], cfg: SimConfig, quiet: bool = False
) -> tuple[list[SimResult], list[dict[str, Any]]]:
    """Run each policy on the same workload and cluster; the oracle always runs (for gpu_hours_vs_oracle), and
    the lower bound is computed once (gpu_hours_vs_lower_bound, the attainable minutes)."""
    return run_variants(workload, nodes, [(n, n, cfg) for n in names], cfg, quiet)


def run_variants(
    workload: SimWorkload,
    nodes: list[NodeSpec],
    variants: list[tuple[str, str, SimConfig]],
    cfg: SimConfig,
    quiet: bool = False,
) -> tuple[list[SimResult], list[dict[str, Any]]]:
    """Run each ``(label, policy, config)`` on the same workload and cluster; each result and scorecard is named
    by its label. The oracle runs once with ``cfg`` (for gpu_hours_vs_oracle), reused when a variant is the oracle
    with that same config."""
    peaks = peak_replicas(workload, cfg.tick_s)

    def one(label: str, name: str, run_cfg: SimConfig) -> SimResult:
        knobs: dict[str, Any] = {"replicas_by_model": peaks} if name == "static" else {}
        policy = make_policy(name, **knobs)
        run_cfg = dataclasses.replace(run_cfg, tick_s=min(run_cfg.tick_s, policy.tick_s))
        if name == "oracle":  # the GPU-hour reference: all of the cluster, no training
            run_cfg = dataclasses.replace(run_cfg, lending=None, static_training_gpus=0)
        bar, cb = (None, None) if quiet else progress_bar(f"simulating {label}")
        try:
            return simulate(workload, nodes, policy, run_cfg, cb)
        finally:
            if bar is not None:
                bar.stop()

    oracle = one("oracle", "oracle", cfg)
    results = []
    for label, name, run_cfg in variants:
        r = dataclasses.replace(oracle) if name == "oracle" and run_cfg == cfg else one(label, name, run_cfg)
        r.policy = label
        results.append(r)
    # The reference for "x lower bound": the cheapest schedule found that meets every attainable model-minute with
    # the real arrivals and each model's cold start, scored by the same engine (autoscaler/sim/lower_bound.py).
    bound = lower_bound(workload, nodes, cfg)
    cards = [scorecard(r, oracle.gpu_hours, lower_bound_gpu_hours=bound.gpu_hours, attainable=bound.attainable)
             for r in results]
    for card in cards:
        card["lower_bound"] = {"gpu_hours": bound.gpu_hours, "per_model_gpu_hours": bound.per_model_gpu_hours,
                               "unattainable": bound.unattainable_reason, "wall_s": bound.wall_s}
    return results, cards


def shipped_scenarios() -> dict[str, str]:
    """The scenarios shipped in autoscaler/data/scenarios, by name (file name without .yaml)."""
    import autoscaler

    out: dict[str, str] = {}
    for root in autoscaler.__path__:
        folder = os.path.join(root, "data", "scenarios")
        if os.path.isdir(folder):
            for f in sorted(os.listdir(folder)):
                if f.endswith(".yaml"):
                    out.setdefault(f[: -len(".yaml")], os.path.join(folder, f))
    return out
