"""The FGD protocol's simulation: pods arrive one at a time, never depart, and are placed or dropped.

State is a handful of numpy arrays over nodes, kept in tie-break order (index 0 = the node with the
smallest seeded prefix), so "highest score, ties to the smallest node name" is ``argmax``'s
first-maximum rule. Per pod: filter (CPU, memory, pod count, GPU model, GPU fit: all hard), ask the
policy for a node and GPUs among the feasible ones, apply, and log used/arrived GPU milli.

Placement semantics (``reference/fgd_protocol.md`` §2): each GPU has 1000 milli; a pod with
``num_gpu`` = 1 and ``gpu_milli`` < 1000 shares one GPU whose free milli covers it; other GPU pods
take ``num_gpu`` fully free GPUs of one node (lowest indices unless the policy says otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from autoscaler.benchmarks.fgd.workload import MILLI, Arrival, Cluster, Pods

MAX_PODS_PER_NODE = 1001  # the cluster YAML's allocatable pods


@dataclass
class PodView:
    """The pod being placed."""

    index: int
    cpu: int
    mem: int
    num_gpu: int
    gpu_milli: int
    spec: int

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def gpu_total(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def tag(self) -> int:
        """GPU-clustering tag as a bit: bit 0 = share-gpu, bit k = k-gpu; 0 = CPU-only."""
        if self.gpu_milli <= 0:
            return 0
        return 1 if self.gpu_milli < MILLI else 1 << self.num_gpu


class State:
    """Free resources per node (nodes in tie-break order). Policies read it; only the simulator writes it."""

    def __init__(self, cluster: Cluster, pods: Pods) -> None:
        self.cluster = cluster
        n, k = len(cluster), max(cluster.max_gpus, 1)
        self.cpu_left = cluster.cpu.copy()
        self.mem_left = cluster.mem.copy()
        self.pods_left = np.full(n, MAX_PODS_PER_NODE, dtype=np.int64)
        # Missing GPUs (nodes with fewer than k) are 0 milli: they add nothing to sums and never fit.
        self.gpu_left = np.where(np.arange(k)[None, :] < cluster.gpus[:, None], MILLI, 0).astype(np.int64)
        self.gpu_sum = self.gpu_left.sum(1)
        self.gpu_max = self.gpu_left.max(1)
        self.full_free = cluster.gpus.copy()
        self.tags = np.zeros(n, dtype=np.int64)
        self.model = cluster.model
        self.gpus = cluster.gpus
        # node_access[spec, node]: the node's GPU model is acceptable to pods of that spec.
        acc = pods.spec_access(cluster.models)
        self.node_access = acc[:, cluster.model]
        self.specs = pods.specs  # PodView.spec indexes these

    def feasible(self, pod: PodView) -> np.ndarray:
        """Indices of nodes where the pod fits (all hard filters), ascending = tie-break order."""
        ok = (self.cpu_left >= pod.cpu) & (self.mem_left >= pod.mem) & (self.pods_left > 0)
        if pod.gpu_milli > 0:
            ok &= self.node_access[pod.spec] & (self.gpus > 0)
            if pod.shared:
                ok &= self.gpu_max >= pod.gpu_milli
            else:
                ok &= self.full_free >= pod.num_gpu
        return np.flatnonzero(ok)

    # -- GPU choice inside a node -----------------------------------------------------------
    def lowest_free_gpus(self, node: int, num: int) -> np.ndarray:
        return np.flatnonzero(self.gpu_left[node] == MILLI)[:num]

    def best_fit_gpu(self, node: int, milli: int) -> int:
        """The fitting GPU with the least free milli, lowest index on ties."""
        row = self.gpu_left[node]
        return int(np.argmin(np.where(row >= milli, row, MILLI + 1)))

    def default_gpus(self, node: int, pod: PodView) -> np.ndarray:
        if pod.gpu_milli <= 0:
            return np.empty(0, dtype=np.int64)
        if pod.shared:
            return np.array([self.best_fit_gpu(node, pod.gpu_milli)])
        return self.lowest_free_gpus(node, pod.num_gpu)

    def apply(self, node: int, gpus: np.ndarray, pod: PodView) -> None:
        self.cpu_left[node] -= pod.cpu
        self.mem_left[node] -= pod.mem
        self.pods_left[node] -= 1
        if len(gpus):
            row = self.gpu_left[node]
            if (row[gpus] < pod.gpu_milli).any():
                raise AssertionError(f"pod {pod.index}: GPUs {gpus.tolist()} of node {node} lack {pod.gpu_milli} milli")
            row[gpus] -= pod.gpu_milli
            self.gpu_sum[node] = row.sum()
            self.gpu_max[node] = row.max()
            self.full_free[node] = int((row == MILLI).sum())
            self.tags[node] |= pod.tag


class Policy(Protocol):
    """A placement policy. ``choose`` returns (node, GPU indices) with node one of ``feasible``."""

    name: str

    def bind(self, state: State, rng: np.random.Generator) -> None: ...

    def choose(self, state: State, pod: PodView, feasible: np.ndarray) -> tuple[int, np.ndarray]: ...

    def placed(self, state: State, node: int) -> None: ...


class LearningPolicy(Policy, Protocol):
    """A policy that also sees every arrival, placed or not, before its filter (to learn the mix)."""

    def arrived(self, state: State, pod: PodView) -> None: ...


@dataclass
class RunResult:
    policy: str
    seed: int
    arrived_milli: np.ndarray  # int64 per pod event, cumulative, incremented before the attempt
    used_milli: np.ndarray  # int64 per pod event, cumulative allocated GPU milli after it
    placed: np.ndarray  # bool per pod
    total_gpus: int
    seconds: float = 0.0
    state: State | None = None  # the final cluster state (nodes in tie-break order)

    @property
    def failed(self) -> int:
        return int((~self.placed).sum())


def simulate(cluster: Cluster, pods: Pods, arrival: Arrival, policy: Policy, rng_seed: int | None = None) -> RunResult:
    """One experiment: ``pods.take(arrival.rows)`` onto ``cluster`` in ``arrival.node_order``."""
    import time

    t0 = time.perf_counter()
    cl = cluster.permuted(arrival.node_order)
    seq = pods.take(arrival.rows)
    state = State(cl, pods)
    policy.bind(state, np.random.default_rng(arrival.seed if rng_seed is None else rng_seed))
    n = len(seq)
    arrived = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    a = u = 0
    cpu, mem, num, milli, spec = (x.tolist() for x in (seq.cpu, seq.mem, seq.num_gpu, seq.gpu_milli, seq.spec))
    learn = getattr(policy, "arrived", None)  # optional: policies that learn the arriving mix
    for i in range(n):
        pod = PodView(i, cpu[i], mem[i], num[i], milli[i], spec[i])
        a += pod.gpu_total
        if learn is not None:
            learn(state, pod)
        feas = state.feasible(pod)
        if len(feas):
            node, gpus = policy.choose(state, pod, feas)
            state.apply(node, gpus, pod)
            policy.placed(state, node)
            u += pod.gpu_total
            placed[i] = True
        arrived[i] = a
        used[i] = u
    return RunResult(policy.name, arrival.seed, arrived, used, placed, cluster.total_gpus,
                     time.perf_counter() - t0, state)
