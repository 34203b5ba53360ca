"""Inputs of the FGD protocol as column arrays: the GPU cluster, the pods, the target workload.

Everything here is plain numpy so one experiment (~10.8k pods on 1,213 nodes) stays cheap: the
simulator indexes these arrays per pod instead of walking objects. Readers of the Alibaba CSVs live
in ``forecasting.traces.alibaba`` (NodeTable/PodTable); this module takes their columns, so
``sharing`` keeps depending on numpy only.

Facts (``reference/fgd_protocol.md`` §1, §4):

- GPU requests are ``num_gpu`` x ``gpu_milli`` (thousandths of one GPU, capped at 1000);
  CPU-only pods have ``num_gpu`` = 0.
- ``gpu_spec`` lists acceptable GPU models separated by ``|``; empty = any.
- The FGD target workload is built from the *original* trace (before tuning): shapes
  ``(cpu, gpu_milli, num_gpu, spec)`` sorted by count (ties: larger cpu, gpu_milli, num_gpu, spec),
  the top ones covering >= 95% of pods kept and renormalised. Memory is not part of a shape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MILLI = 1000
TUNE_RATIO = 1.3
TARGET_COVERAGE = 0.95


@dataclass(frozen=True, eq=False)
class Cluster:
    """GPU nodes: per-node CPU (milli), memory (MiB), GPU count and GPU model index into ``models``."""

    names: np.ndarray  # str
    cpu: np.ndarray  # int64 milli
    mem: np.ndarray  # int64 MiB
    gpus: np.ndarray  # int64
    model: np.ndarray  # int64 index into models
    models: tuple[str, ...]

    @classmethod
    def from_columns(
        cls,
        names: Sequence[str],
        cpu: Sequence[int],
        mem: Sequence[int],
        gpus: Sequence[int],
        models: Sequence[str],
        gpu_only: bool = True,
    ) -> Cluster:
        """Build from node-list columns; ``gpu_only`` drops CPU-only nodes (the protocol's cluster)."""
        names_a = np.asarray(names, dtype=str)
        gpus_a = np.asarray(gpus, dtype=np.int64)
        keep = gpus_a > 0 if gpu_only else np.ones(len(names_a), bool)
        model_names = [str(m) for m in np.asarray(models, dtype=str)[keep]]
        kinds = tuple(sorted(set(model_names)))
        idx = {k: i for i, k in enumerate(kinds)}
        return cls(
            names=names_a[keep],
            cpu=np.asarray(cpu, dtype=np.int64)[keep],
            mem=np.asarray(mem, dtype=np.int64)[keep],
            gpus=gpus_a[keep],
            model=np.array([idx[m] for m in model_names], dtype=np.int64),
            models=kinds,
        )

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpus(self) -> int:
        return int(self.gpus.sum())

    @property
    def max_gpus(self) -> int:
        return int(self.gpus.max()) if len(self.gpus) else 0

    def permuted(self, order: np.ndarray) -> Cluster:
        """The same nodes in ``order`` (the simulator keeps nodes in tie-break order)."""
        return Cluster(self.names[order], self.cpu[order], self.mem[order], self.gpus[order], self.model[order],
                       self.models)


@dataclass(frozen=True, eq=False)
class Pods:
    """Pods in arrival order. ``spec`` indexes ``specs`` (the distinct ``gpu_spec`` strings)."""

    names: np.ndarray  # str
    cpu: np.ndarray  # int64 milli
    mem: np.ndarray  # int64 MiB
    num_gpu: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64 per GPU, 0..1000; 0 for CPU-only pods
    spec: np.ndarray  # int64 index into specs
    specs: tuple[str, ...]

    @classmethod
    def from_columns(
        cls,
        names: Sequence[str],
        cpu: Sequence[int],
        mem: Sequence[int],
        num_gpu: Sequence[int],
        gpu_milli: Sequence[int],
        gpu_spec: Sequence[str] | None = None,
    ) -> Pods:
        n = len(names)
        num = np.asarray(num_gpu, dtype=np.int64)
        # The converter writes GPU annotations only for num_gpu != 0 and caps milli at one GPU.
        milli = np.where(num > 0, np.minimum(np.asarray(gpu_milli, dtype=np.int64), MILLI), 0)
        spec_s = [str(s).strip() for s in gpu_spec] if gpu_spec is not None else [""] * n
        specs = tuple(sorted(set(spec_s)))
        sidx = {s: i for i, s in enumerate(specs)}
        return cls(
            names=np.asarray(names, dtype=str),
            cpu=np.asarray(cpu, dtype=np.int64),
            mem=np.asarray(mem, dtype=np.int64),
            num_gpu=num,
            gpu_milli=milli,
            spec=np.array([sidx[s] for s in spec_s], dtype=np.int64),
            specs=specs,
        )

    def __len__(self) -> int:
        return len(self.names)

    def take(self, rows: np.ndarray) -> Pods:
        """Pods at ``rows`` (repeats allowed: clones), in that order."""
        return Pods(self.names[rows], self.cpu[rows], self.mem[rows], self.num_gpu[rows], self.gpu_milli[rows],
                    self.spec[rows], self.specs)

    @property
    def gpu_request(self) -> np.ndarray:
        """Total GPU milli each pod asks for."""
        return self.num_gpu * self.gpu_milli

    def spec_access(self, models: Sequence[str]) -> np.ndarray:
        """Bool (n_specs, n_models): which GPU models each spec accepts (empty spec = all)."""
        out = np.zeros((len(self.specs), len(models)), dtype=bool)
        for i, s in enumerate(self.specs):
            allowed = {x for x in s.split("|") if x}
            for j, m in enumerate(models):
                out[i, j] = not allowed or m in allowed
        return out


@dataclass(frozen=True)
class TargetShapes:
    """FGD's target workload M: shapes with popularity ``p`` (sums to 1)."""

    cpu: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64
    num_gpu: np.ndarray  # int64
    spec: tuple[str, ...]
    counts: np.ndarray  # int64 pods of each shape in the trace
    p: np.ndarray  # float64, counts renormalised
    coverage: float  # fraction of trace pods the kept shapes cover
    total_shapes: int

    def __len__(self) -> int:
        return len(self.p)

    def access(self, models: Sequence[str]) -> np.ndarray:
        """Bool (n_models, n_shapes): the node model is acceptable to the shape."""
        out = np.zeros((len(models), len(self.p)), dtype=bool)
        for j, s in enumerate(self.spec):
            allowed = {x for x in s.split("|") if x}
            for i, m in enumerate(models):
                out[i, j] = not allowed or m in allowed
        return out


def target_shapes(pods: Pods, coverage: float = TARGET_COVERAGE) -> TargetShapes:
    """The top shapes by count covering ``coverage`` of ``pods`` (the original trace, not tuned)."""
    counts: Counter[tuple[int, int, int, str]] = Counter(
        zip(
            pods.cpu.tolist(),
            pods.gpu_milli.tolist(),
            pods.num_gpu.tolist(),
            [pods.specs[i] for i in pods.spec.tolist()],
            strict=True,
        )
    )
    # Count descending; ties to the larger cpu, then gpu_milli, num_gpu, spec (GetTypicalPods).
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], *kv[0]), reverse=True)
    total = len(pods)
    kept: list[tuple[tuple[int, int, int, str], int]] = []
    acc = 0
    for shape, c in ordered:
        kept.append((shape, c))
        acc += c
        if acc / total >= coverage:
            break
    w = np.array([c for _, c in kept], dtype=np.float64)
    return TargetShapes(
        cpu=np.array([s[0] for s, _ in kept], dtype=np.int64),
        gpu_milli=np.array([s[1] for s, _ in kept], dtype=np.int64),
        num_gpu=np.array([s[2] for s, _ in kept], dtype=np.int64),
        spec=tuple(s[3] for s, _ in kept),
        counts=w.astype(np.int64),
        p=w / w.sum(),
        coverage=acc / total if total else 0.0,
        total_shapes=len(counts),
    )


@dataclass(frozen=True)
class Arrival:
    """One experiment's input: source rows of the trace in arrival order and the node tie-break order."""

    rows: np.ndarray  # int64 row of the (name-sorted) trace per arriving pod; clones repeat rows
    node_order: np.ndarray  # int64 node indices, best tie-break first
    seed: int


def tune_rows(pods: Pods, total_gpus: int, seed: int, ratio: float = TUNE_RATIO) -> np.ndarray:
    """An arrival order following the protocol's steps with numpy's RNG (not Go's: not bit-equal).

    Shuffle the name-sorted pods, then clone uniformly drawn pods (appended at the end) until the
    next clone's *per-GPU* milli would pass ``ratio`` x capacity, or delete random pods while above.
    """
    rng = np.random.default_rng(seed)
    order = np.argsort(pods.names, kind="stable")
    rows = list(order[rng.permutation(len(order))].tolist())
    target = ratio * total_gpus * MILLI
    req = pods.gpu_request
    total = int(req[rows].sum())
    if total <= target:
        while True:
            r = int(rng.integers(len(pods)))
            # Quirk kept from the original: the stop test adds per-GPU milli, not the pod's total.
            if total + int(pods.gpu_milli[r]) > target:
                break
            rows.append(r)
            total += int(req[r])
    else:
        while total > target and rows:
            i = int(rng.integers(len(rows)))
            total -= int(req[rows.pop(i)])
    return np.asarray(rows, dtype=np.int64)


def random_arrival(pods: Pods, n_nodes: int, total_gpus: int, seed: int) -> Arrival:
    rng = np.random.default_rng([seed, 1])
    return Arrival(tune_rows(pods, total_gpus, seed), rng.permutation(n_nodes).astype(np.int64), seed)


def _read_csv(path: str) -> tuple[list[str], list[list[str]]]:
    import csv

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path}: empty file")
    return [h.strip() for h in rows[0]], [r for r in rows[1:] if r]


def _col(header: list[str], rows: list[list[str]], name: str, path: str, default: str | None = None) -> list[str]:
    if name not in header:
        if default is not None:
            return [default] * len(rows)
        raise ValueError(f"{path}: no column {name!r} (have {', '.join(header)})")
    i = header.index(name)
    return [r[i].strip() if i < len(r) else "" for r in rows]


def _ints(vals: list[str], name: str, path: str) -> list[int]:
    try:
        return [int(float(v)) if v else 0 for v in vals]
    except ValueError as e:
        raise ValueError(f"{path}: column {name!r}: {e}") from None


def read_cluster_csv(path: str, gpu_only: bool = True) -> Cluster:
    """An Alibaba node list (``sn,cpu_milli,memory_mib,gpu,model``) as a :class:`Cluster`.

    A stdlib reader so ``sharing`` needs nothing beyond numpy; ``forecasting.traces.alibaba`` has
    the full-featured one for inspection.
    """
    h, rows = _read_csv(path)
    return Cluster.from_columns(
        _col(h, rows, "sn", path),
        _ints(_col(h, rows, "cpu_milli", path), "cpu_milli", path),
        _ints(_col(h, rows, "memory_mib", path), "memory_mib", path),
        _ints(_col(h, rows, "gpu", path), "gpu", path),
        _col(h, rows, "model", path, default=""),
        gpu_only=gpu_only,
    )


def read_pods_csv(path: str) -> Pods:
    """An Alibaba pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]``), sorted by name
    as the protocol's pool is."""
    h, rows = _read_csv(path)
    names = _col(h, rows, "name", path)
    order = sorted(range(len(rows)), key=lambda i: names[i])
    rows = [rows[i] for i in order]
    return Pods.from_columns(
        _col(h, rows, "name", path),
        _ints(_col(h, rows, "cpu_milli", path), "cpu_milli", path),
        _ints(_col(h, rows, "memory_mib", path), "memory_mib", path),
        _ints(_col(h, rows, "num_gpu", path), "num_gpu", path),
        _ints(_col(h, rows, "gpu_milli", path), "gpu_milli", path),
        _col(h, rows, "gpu_spec", path, default=""),
    )
