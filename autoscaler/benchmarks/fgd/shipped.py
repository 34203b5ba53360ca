"""The product packer in the FGD replay: each FGD pod placed by :class:`sharing.packer.CostAwarePacker`, as shipped.

``slotwise`` (``slotwise.py``) is a research policy written against the replay's arrays; this one measures what the
decision core actually runs, through an adapter that mirrors the replay's cluster in an
:class:`~sharing.slots.Inventory` and turns each pod into a :class:`~sharing.slots.SlotRequest`:

- **GPUs**: every FGD GPU model becomes a catalog kind without MIG, 1,000 GiB of "memory" (1 GiB per milli) and one
  price for all (so cost ranks by the share of a GPU only); the inventory has no share reserve and no compute
  oversubscription, so a time-slice share fits exactly where the replay's free milli covers it.
- **Pods**: ``num_gpu`` = 1 and ``gpu_milli`` < 1000 -> a time-slice share (``kinds=("share",)``, ``memory_gib`` =
  ``gpu_milli``, ``compute_fraction`` = ``gpu_milli / 1000``); any other GPU pod -> ``num_gpu`` whole GPUs;
  ``gpu_spec`` -> ``gpu_models``; CPU (milli) and memory (MiB / 1024) -> the host requests. Every pod is its own
  model (no anti-affinity: FGD pods are not replicas of one another).
- **Nodes**: the node CSV's CPU and memory -> ``NodeSpec.cpu_millis`` / ``host_memory_gib``, in the replay's
  tie-break order (the packer's last tie-break, inventory order, is then the replay's).

Where the mapping is not exact: **CPU-only pods** are not the packer's (a slot needs a GPU). The adapter holds
their CPU and memory on the node (:meth:`~sharing.slots.Inventory.hold_host`, as the live snapshot does for pods
without a GPU slot) on the node :meth:`~sharing.packer.CostAwarePacker.hold_node` picks: the least stranding and
fragmentation cost (at the ratio the packer learns, for the workload it was handed), then the least free GPU
capacity, then replay order; with nothing to weigh, the first node with room. The packer chooses whole GPUs
from a node's highest indices (the replay's default is the lowest; the count is the same). The replay's
per-node pod limit is not modelled (1,001 pods, never reached). If the packer finds no slot where the replay's
filter found one (it should not happen: the test checks the two agree), the pod goes to the replay's first
feasible node with its default GPUs and ``mismatches`` counts it.
"""

from __future__ import annotations

import numpy as np

from autoscaler.benchmarks.fgd.policies import _Base
from autoscaler.benchmarks.fgd.sim import PodView, State
from autoscaler.benchmarks.fgd.workload import MILLI, TargetShapes
from sharing.catalog import Catalog, GpuModel
from sharing.fragmentation import ShapeKey, TargetWorkload, shape_key
from sharing.packer import CostAwarePacker
from sharing.slots import Inventory, NodeSpec, Slot, SlotRequest

MIB_PER_GIB = 1024.0


def kind_name(model: str) -> str:
    return f"fgd-{model}"


def replay_catalog(models: tuple[str, ...]) -> Catalog:
    """One plain GPU kind per FGD model: 1 GiB per milli, the same price for all."""
    return Catalog([GpuModel(kind_name(m), float(MILLI), 0, 0, price_per_hour=1.0) for m in models])


def replay_nodes(state: State) -> list[NodeSpec]:
    cl = state.cluster
    return [NodeSpec(f"{i:05d}-{cl.names[i]}", kind_name(cl.models[int(cl.model[i])]), int(cl.gpus[i]),
                     cpu_millis=int(cl.cpu[i]), host_memory_gib=float(cl.mem[i]) / MIB_PER_GIB)
            for i in range(len(cl))]


def pod_request(pod: PodView, spec: str) -> SlotRequest:
    """The slot request of one FGD GPU pod (module docstring)."""
    allowed = tuple(kind_name(m) for m in spec.split("|") if m)
    host = {"cpu_millis": int(pod.cpu), "host_memory_gib": float(pod.mem) / MIB_PER_GIB}
    if pod.shared:
        return SlotRequest(f"p{pod.index}", float(pod.gpu_milli), pod.gpu_milli / MILLI, kinds=("share",),
                           gpu_models=allowed, **host)
    return SlotRequest(f"p{pod.index}", None, gpus=int(pod.num_gpu), kinds=("whole",), gpu_models=allowed, **host)


class ShippedPolicy(_Base):
    """FGD pods placed by the product's ``CostAwarePacker`` (module docstring); ``host_aware`` False ranks without
    the host-resource tie-break (host CPU/memory stay hard either way); ``shapes`` (FGD's target workload, its own
    input) seeds the :class:`~sharing.fragmentation.TargetWorkload` the adapter learns from the arrivals and hands the
    packer every ``refresh_every`` arrivals, as a controller hands it the demand it is about to place; without it the
    packer weighs no fragmentation."""

    def __init__(self, host_aware: bool = True, shapes: TargetShapes | None = None, refresh_every: int = 200,
                 name: str | None = None, **packer: float) -> None:
        self.host_aware = host_aware
        self.shapes = shapes
        self.refresh_every = refresh_every
        self.packer_options = packer
        self.name = name or ("shipped" if host_aware else "shipped-nohost")
        self.mismatches = 0

    def bind(self, state: State, rng: np.random.Generator) -> None:
        super().bind(state, rng)
        self.inv = Inventory.from_nodes(replay_nodes(state), replay_catalog(state.cluster.models),
                                        share_reserve_gib=0.0, max_compute_oversubscription=1.0)
        self.names = list(self.inv.nodes)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.packer = CostAwarePacker(anti_affinity=False, host_aware=self.host_aware, **self.packer_options)
        self.mismatches = 0
        self.work = None if self.shapes is None else TargetWorkload(prior_shapes(self.shapes, state.specs))
        self.since = 0
        if self.work is not None:
            self.packer.target_workload(self.work.shapes())

    def arrived(self, state: State, pod: PodView) -> None:
        if self.work is None:
            return
        self.work.observe(pod_key(pod, state.specs[pod.spec]), float(pod.mem) / MIB_PER_GIB)
        self.since += 1
        if self.since >= self.refresh_every:
            self.since = 0
            self.packer.target_workload(self.work.shapes())

    def choose(self, state: State, pod: PodView, feas: np.ndarray) -> tuple[int, np.ndarray]:
        if pod.gpu_milli <= 0:
            name = self.packer.hold_node(self.inv, int(pod.cpu), float(pod.mem) / MIB_PER_GIB)
            node = self.index[name] if name is not None else -1
            if node not in set(feas.tolist()):  # not expected: the replay's first feasible node, mirrored
                self.mismatches += 1
                node = int(feas[0])
            self.inv.hold_host(self.names[node], int(pod.cpu), float(pod.mem) / MIB_PER_GIB)
            return node, np.empty(0, dtype=np.int64)
        req = pod_request(pod, state.specs[pod.spec])
        slot = self.packer.place(self.inv, req)
        if slot is None:  # not expected (module docstring): the replay's default, mirrored
            self.mismatches += 1
            node = int(feas[0])
            gpus = state.default_gpus(node, pod)
            slot = self._mirror(node, gpus, req)
        self.inv.allocate(slot, f"p{pod.index}")
        return self.index[slot.node], np.array(slot.devices, dtype=np.int64)

    def _mirror(self, node: int, gpus: np.ndarray, req: SlotRequest) -> Slot:
        name = self.names[node]
        gpu = self.inv.gpu_of(name)
        if req.whole_only:
            slot = Slot.whole(name, [int(g) for g in gpus], gpu)
        else:
            slot = Slot.share(name, int(gpus[0]), gpu, float(req.memory_gib or 0.0), req.compute_fraction)
        return slot.with_host(req.cpu_millis, req.host_memory_gib)


def pod_key(pod: PodView, spec: str) -> ShapeKey:
    """The target-workload bin of one FGD pod: its slot request's (:func:`pod_request`), or a CPU-only shape."""
    if pod.gpu_milli <= 0:
        return (0, None, 0.0, int(pod.cpu), ())
    return shape_key(pod_request(pod, spec))


def prior_shapes(shapes: TargetShapes, specs: tuple[str, ...] | list[str]) -> list[tuple[ShapeKey, float, float]]:
    """FGD's target shapes as the learned workload's prior: (bin, count, host memory 0 = not yet seen)."""
    out = []
    for j in range(len(shapes)):
        spec = shapes.spec[j]
        view = PodView(-1, int(shapes.cpu[j]), 0, int(shapes.num_gpu[j]), int(shapes.gpu_milli[j]), 0)
        key = pod_key(view, spec) if view.gpu_milli > 0 else (0, None, 0.0, int(shapes.cpu[j]), ())
        out.append((key, float(shapes.counts[j]), 0.0))
    return out
