"""Alibaba GPU cluster trace v2023 (alibaba/clusterdata ``cluster-trace-gpu-v2023``).

Not traffic: a node inventory and a pod list, as used by GPU-packing (fragmentation) studies.

* nodes: ``sn,cpu_milli,memory_mib,gpu,model`` (``model`` empty on CPU-only nodes)
* pods: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` then optionally
  ``gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``. ``gpu_milli`` is the share
  of each requested GPU in thousandths (``< 1000`` on a single GPU = a GPU-sharing pod);
  ``gpu_spec`` lists acceptable GPU models separated by ``|`` (empty = any).

Both load into frozen column tables (numpy arrays) a packing benchmark can index directly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from forecasting.traces._io import CsvTable, floats, ints, read_csv

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL_TEXT = ("gpu_spec", "qos", "pod_phase")
POD_TIMES = ("creation_time", "deletion_time", "scheduled_time")
FULL_GPU_MILLI = 1000


@dataclass(frozen=True, eq=False)
class NodeTable:
    name: np.ndarray  # str
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    gpus: np.ndarray  # int64, GPUs on the node
    gpu_model: np.ndarray  # str, "" on CPU-only nodes
    source: str = ""

    def __len__(self) -> int:
        return len(self.name)

    @property
    def total_gpus(self) -> int:
        return int(self.gpus.sum())

    def gpus_by_model(self) -> dict[str, int]:
        """GPU count per GPU model, largest first."""
        c: Counter[str] = Counter()
        for m, g in zip(self.gpu_model.tolist(), self.gpus.tolist(), strict=True):
            if g:
                c[m or "?"] += g
        return dict(c.most_common())

    def describe(self) -> list[str]:
        gpu_nodes = int((self.gpus > 0).sum())
        lines = [
            "kind: nodes (cluster inventory, not traffic)",
            f"nodes: {len(self)} ({gpu_nodes} with GPUs, {len(self) - gpu_nodes} CPU-only)",
            f"GPUs: {self.total_gpus}",
            f"CPU: {self.cpu_milli.sum() / 1000:g} cores, memory: {self.memory_mib.sum() / 1024:g} GiB",
            "GPUs by model: " + ", ".join(f"{m} {n}" for m, n in self.gpus_by_model().items()),
        ]
        per_node = Counter(self.gpus[self.gpus > 0].tolist())
        lines.append("GPUs per node: " + ", ".join(f"{k}x{v}" for k, v in sorted(per_node.items())))
        return lines


@dataclass(frozen=True, eq=False)
class PodTable:
    name: np.ndarray  # str
    cpu_milli: np.ndarray  # int64
    memory_mib: np.ndarray  # int64
    num_gpu: np.ndarray  # int64
    gpu_milli: np.ndarray  # int64, per requested GPU, 0..1000
    gpu_spec: np.ndarray  # str, "|"-separated acceptable models, "" = any
    qos: np.ndarray | None = None  # str
    phase: np.ndarray | None = None  # str
    creation_time: np.ndarray | None = None  # float64 s, NaN where missing
    deletion_time: np.ndarray | None = None
    scheduled_time: np.ndarray | None = None
    source: str = ""

    def __len__(self) -> int:
        return len(self.name)

    @property
    def gpu_pods(self) -> np.ndarray:
        return (self.num_gpu > 0) & (self.gpu_milli > 0)

    @property
    def sharing(self) -> np.ndarray:
        """Pods that take a fraction of one GPU, i.e. can share it with others."""
        return (self.num_gpu == 1) & (self.gpu_milli > 0) & (self.gpu_milli < FULL_GPU_MILLI)

    @property
    def sharing_fraction(self) -> float:
        """Fraction of GPU-requesting pods that share a GPU."""
        n = int(self.gpu_pods.sum())
        return float(self.sharing.sum()) / n if n else 0.0

    @property
    def gpu_demand(self) -> float:
        """Total GPUs requested (fractions included)."""
        return float((self.num_gpu * self.gpu_milli).sum()) / FULL_GPU_MILLI

    def allowed_models(self, i: int) -> tuple[str, ...]:
        """GPU models pod ``i`` accepts; empty tuple = any."""
        spec = str(self.gpu_spec[i])
        return tuple(s for s in spec.split("|") if s) if spec else ()

    def describe(self) -> list[str]:
        gpu = self.gpu_pods
        lines = [
            "kind: pods (GPU pod list, not traffic)",
            f"pods: {len(self)} ({int(gpu.sum())} request GPUs, {len(self) - int(gpu.sum())} CPU-only)",
            f"GPU-sharing pods: {int(self.sharing.sum())} ({self.sharing_fraction:.1%} of GPU pods)",
            f"GPU demand: {self.gpu_demand:.1f} GPUs; CPU demand: {self.cpu_milli.sum() / 1000:g} cores",
            "GPUs per pod: " + ", ".join(f"{k}x{v}" for k, v in sorted(Counter(self.num_gpu[gpu].tolist()).items())),
            f"constrained to GPU models: {int((self.gpu_spec != '').sum())} pods",
        ]
        for label, arr in (("qos", self.qos), ("phase", self.phase)):
            if arr is not None:
                lines.append(f"{label}: " + ", ".join(f"{k} {v}" for k, v in Counter(arr.tolist()).most_common()))
        return lines


def _text(table: CsvTable, name: str, *, required: bool = False) -> np.ndarray | None:
    idx = table.index(name, required=required)
    if idx is None:
        return None
    return np.array([v.strip() for v in table.column(idx)])


def _names(table: CsvTable, name: str) -> np.ndarray:
    arr = _text(table, name, required=True)
    assert arr is not None
    empty = arr == ""
    if empty.any():
        raise table.error(int(np.argmax(empty)), name, "missing value")
    return arr


def _int_col(table: CsvTable, name: str) -> np.ndarray:
    idx = table.index(name)
    assert idx is not None
    return ints(table, idx, name, min_value=0)


def read_nodes(path: str | Path) -> NodeTable:
    table = read_csv(Path(path))
    model = _text(table, "model")
    return NodeTable(
        name=_names(table, "sn"),
        cpu_milli=_int_col(table, "cpu_milli"),
        memory_mib=_int_col(table, "memory_mib"),
        gpus=_int_col(table, "gpu"),
        gpu_model=model if model is not None else np.full(len(table), "", dtype="<U1"),
        source=str(path),
    )


def read_pods(path: str | Path) -> PodTable:
    table = read_csv(Path(path))
    gpu_milli = _int_col(table, "gpu_milli")
    over = gpu_milli > FULL_GPU_MILLI
    if over.any():
        raise table.error(int(np.argmax(over)), "gpu_milli", f"above {FULL_GPU_MILLI} (one whole GPU)")
    times: dict[str, np.ndarray | None] = {}
    for name in POD_TIMES:
        idx = table.index(name, required=False)
        times[name] = None if idx is None else floats(table, idx, name, allow_empty=True, min_value=0.0)
    spec = _text(table, "gpu_spec")
    return PodTable(
        name=_names(table, "name"),
        cpu_milli=_int_col(table, "cpu_milli"),
        memory_mib=_int_col(table, "memory_mib"),
        num_gpu=_int_col(table, "num_gpu"),
        gpu_milli=gpu_milli,
        gpu_spec=spec if spec is not None else np.full(len(table), "", dtype="<U1"),
        qos=_text(table, "qos"),
        phase=_text(table, "pod_phase"),
        creation_time=times["creation_time"],
        deletion_time=times["deletion_time"],
        scheduled_time=times["scheduled_time"],
        source=str(path),
    )
