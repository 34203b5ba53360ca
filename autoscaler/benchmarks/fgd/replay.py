"""Replay files: the exact arrival order and node tie-break order of the FGD paper's simulator.

``<dir>/arrival_order_<trace>.csv.gz`` (seed, pos, name, src_row, clone_id, num_gpu, gpu_milli) and
``<dir>/node_prefix_<trace>.csv.gz`` (seed, node, prefix), generated with Go's ``math/rand`` exactly
as the simulator does. Joining on the pod *name* (clones keep the original's name) gives cpu,
memory and spec from the trace; the node with the smallest prefix wins every scoring tie.
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np

from autoscaler.benchmarks.fgd.workload import Arrival, Cluster, Pods


class ReplayError(ValueError):
    """A replay file that does not match the trace or cluster it is replayed against."""


def replay_paths(replay_dir: str | Path, trace_stem: str) -> tuple[Path, Path]:
    d = Path(replay_dir)
    return d / f"arrival_order_{trace_stem}.csv.gz", d / f"node_prefix_{trace_stem}.csv.gz"


def has_replay(replay_dir: str | Path, trace_stem: str) -> bool:
    return all(p.exists() for p in replay_paths(replay_dir, trace_stem))


def load_replay(replay_dir: str | Path, trace_stem: str, pods: Pods, cluster: Cluster,
                seeds: list[int] | None = None) -> dict[int, Arrival]:
    """Per seed, the arrival rows (into ``pods``) and node order (into ``cluster``)."""
    arr_path, pre_path = replay_paths(replay_dir, trace_stem)
    want = set(seeds) if seeds is not None else None
    row_of = {str(n): i for i, n in enumerate(pods.names.tolist())}
    node_of = {str(n): i for i, n in enumerate(cluster.names.tolist())}
    rows: dict[int, list[tuple[int, int]]] = {}
    with gzip.open(arr_path, "rt", newline="") as f:
        for rec in csv.DictReader(f):
            seed = int(rec["seed"])
            if want is not None and seed not in want:
                continue
            name = rec["name"]
            if name not in row_of:
                raise ReplayError(f"{arr_path}: pod {name!r} is not in the trace")
            r = row_of[name]
            if int(rec["num_gpu"]) != int(pods.num_gpu[r]):
                raise ReplayError(f"{arr_path}: pod {name!r} num_gpu {rec['num_gpu']} != trace {pods.num_gpu[r]}")
            rows.setdefault(seed, []).append((int(rec["pos"]), r))
    prefixes: dict[int, np.ndarray] = {}
    with gzip.open(pre_path, "rt", newline="") as f:
        for rec in csv.DictReader(f):
            seed = int(rec["seed"])
            if want is not None and seed not in want:
                continue
            node = rec["node"]
            if node not in node_of:
                raise ReplayError(f"{pre_path}: node {node!r} is not in the cluster")
            pre = prefixes.setdefault(seed, np.full(len(cluster), -1, dtype=np.int64))
            pre[node_of[node]] = int(rec["prefix"])
    out: dict[int, Arrival] = {}
    for seed, rs in sorted(rows.items()):
        if seed not in prefixes:
            raise ReplayError(f"{pre_path}: no node prefixes for seed {seed}")
        pre = prefixes[seed]
        if (pre < 0).any():
            raise ReplayError(f"{pre_path}: seed {seed} lacks a prefix for {int((pre < 0).sum())} nodes")
        rs.sort()
        out[seed] = Arrival(np.array([r for _, r in rs], dtype=np.int64), np.argsort(pre, kind="stable"), seed)
    if want is not None and want - set(out):
        raise ReplayError(f"{arr_path}: no arrival order for seed(s) {sorted(want - set(out))}")
    return out
