"""Cost attribution: who holds which GPUs, for how long, at what price.

The unit is the **GPU-equivalent**: a replica on ``n`` whole GPUs holds ``n``, one on a MIG instance holds the
instance's compute fraction of its GPU (a 3g on a 7-slice GPU: 3/7), one on a time-slice share holds the share's
compute fraction (:func:`slot_fraction`, the same number as ``Slot.gpu_fraction`` and as the simulator's
``gpu_hours``); a replica that is a group of pods (a LeaderWorkerSet replica) holds the sum over its pods' slots.
GPU-equivalent seconds times the GPU kind's USD per GPU-hour / 3600 is the cost.

Why compute and not memory for MIG: the contract (and ``slotwise_gpu_slots``) count GPU-equivalents by compute,
so attributed cost plus idle cost adds up to the price of the GPUs. A MIG layout whose memory slices run out
before its compute (two 3g on an H100 leave 1/7 of compute no slice can reach) shows that remainder as idle,
which is the honest place for it: no team asked for it, the layout stranded it.

**Idle reserved** is what lending will target: free GPU-equivalents on nodes that hold at least one inference
replica (per device ``1 - min(1, compute used)``, 0 under a whole-GPU slot). Nodes without inference replicas
are not inference's reservation and do not count.

The pure core (:func:`slot_fraction`, :func:`price_table`, :func:`usage`, :func:`idle`) is what the
simulator's accounting is tested against; the live controller exports it as Prometheus counters
(:mod:`autoscaler.live.cost_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation
from sharing.catalog import Catalog
from sharing.slots import Inventory, Slot, SlotKind

DEFAULT_TEAM = "default"  # the model's spec sets no team (the spec's own default)
UNKNOWN_TEAM = "unknown"  # the model's annotations are invalid, so its team annotation cannot be read


def slot_fraction(slot: Slot) -> float:
    """GPU-equivalents one slot costs: ``n`` for ``n`` whole GPUs, else its compute fraction of one GPU."""
    if slot.kind is SlotKind.WHOLE:
        return float(len(slot.devices))
    return float(slot.compute_fraction)


def price_table(catalog: Catalog, overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """USD per GPU-hour by canonical GPU kind: the catalog's prices, ``overrides`` keyed by any accepted name
    (canonical, alias, GFD product label). An unknown kind or a negative price is a ``ValueError``."""
    if overrides:
        try:
            catalog = catalog.with_prices(overrides)
        except KeyError as e:  # unknown GPU kind: a configuration error, said in one line
            raise ValueError(f"price table: {e.args[0]}") from None
    return {name: float(catalog.get(name).price_per_hour) for name in catalog.names()}


def identity(key: str, obs: ModelObservation) -> tuple[str, str]:
    """``(team, namespace)`` of a model: the team from its spec (``slotwise.io/team``; :data:`UNKNOWN_TEAM`
    when the annotations are invalid), the namespace from the key ``"<ns>/<name>"``, else from the spec."""
    spec = obs.spec
    team = spec.team if spec is not None else UNKNOWN_TEAM
    if "/" in key:
        namespace = key.split("/", 1)[0]
    else:  # the simulator's models are plain names: the spec knows the namespace
        namespace = spec.namespace if spec is not None else "default"
    return team or DEFAULT_TEAM, namespace


@dataclass(frozen=True)
class Usage:
    """GPU-equivalents one model holds on one GPU kind right now."""

    team: str
    namespace: str
    model: str  # the snapshot's model key ("<ns>/<name>" live, the plain name in the simulator)
    gpu_model: str
    gpus: float


def usage(snapshot: ClusterSnapshot) -> list[Usage]:
    """Per (team, namespace, model, gpu_model): GPU-equivalents the model's placed replicas hold now.

    Every replica with a slot counts, ready or starting or draining: the GPU is taken from the moment the
    replica is placed until its slot is released. Replicas without a slot (Pending, or on a node outside the
    inventory) hold nothing known. Rows come in snapshot order, kinds sorted.
    """
    out: list[Usage] = []
    for key, obs in snapshot.models.items():
        held: dict[str, float] = {}
        for r in obs.replicas:
            if r.slot is not None:
                held[r.slot.gpu_model] = held.get(r.slot.gpu_model, 0.0) + slot_fraction(r.slot)
                for s in r.group_slots:  # a replica that is a group of pods holds every pod's slot
                    held[s.gpu_model] = held.get(s.gpu_model, 0.0) + slot_fraction(s)
        if not held:
            continue
        team, ns = identity(key, obs)
        out.extend(Usage(team, ns, key, kind, gpus) for kind, gpus in sorted(held.items()))
    return out


def inference_nodes(snapshot: ClusterSnapshot) -> set[str]:
    """Nodes holding at least one managed model's replica (or a pod of one that is a group)."""
    return {s.node for obs in snapshot.models.values() for r in obs.replicas if r.slot is not None
            for s in (r.slot, *r.group_slots)}


def idle(inventory: Inventory, nodes: Iterable[str]) -> dict[str, float]:
    """GPU kind -> free GPU-equivalents on ``nodes`` (per device ``1 - min(1, compute used)``, 0 under a whole
    slot; everything allocated counts as used, a training pod too: capacity already lent is not idle).
    Every kind of the given nodes appears, 0 when full."""
    wanted = set(nodes)
    out: dict[str, float] = {}
    for (node, _), d in inventory.devices.items():
        if node not in wanted:
            continue
        if d.whole_owner is not None:
            used = 1.0
        else:  # time-slicing may oversubscribe compute: a device is at most fully used
            used = min(1.0, sum(s.compute_fraction for _, s in d.entries))
        out[d.gpu_model] = out.get(d.gpu_model, 0.0) + (1.0 - used)
    return out


def idle_reserved(snapshot: ClusterSnapshot) -> dict[str, float]:
    """GPU kind -> idle reserved GPU-equivalents now: free capacity on nodes that hold inference replicas."""
    return idle(snapshot.inventory, inference_nodes(snapshot))
