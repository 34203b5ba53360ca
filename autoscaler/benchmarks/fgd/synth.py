"""Synthetic trace variants for checking that a policy generalises beyond the shared FGD variants.

The FGD repository's held-out variants (cpu100-250, gpushare60-100, gpuspec20-33, multigpu40-50)
change the mix of the default trace: more CPU-only pods, more shared-GPU pods, more pods pinned to
a GPU model, more multi-GPU pods. This module makes such mixes from ``openb_pod_list_default.csv``
by resampling its own pods (seeded, so the files are reproducible), without copying the real
variants' numbers:

- ``cpu200s``: the CPU-only pods cloned once (twice as many);
- ``gpushare70s`` / ``gpushare85s``: single whole-GPU pods replaced by copies of random shared pods
  until shared pods are 70% / 85% of GPU pods;
- ``gpuspec25s`` / ``gpuspec35s``: about 25% / 35% of GPU pods get a ``gpu_spec`` drawn from the
  pinned pods of ``--spec-from`` (the default trace has none);
- ``multigpu45s``: single-GPU pods replaced by copies of random multi-GPU pods until multi-GPU pods
  ask for 45% of the GPU milli;
- ``cpu250s`` / ``cpu300s``: 2.5x / 3x the CPU-only pods, so CPU (not GPU) runs out first on many
  GPU nodes (the mix on which FGD's CPU-aware fragmentation matters most);
- ``mem250s``: 35% of the pods (GPU and CPU-only) ask for 2.5x their memory, so memory is a
  binding filter: about 120% of the cluster's memory at 130% GPU arrival;
- ``multigpu70s``: mostly multi-GPU pods (they ask for 70% of the GPU milli).

    python -m autoscaler.benchmarks.fgd.synth --pods .../openb_pod_list_default.csv \
        --spec-from .../openb_pod_list_gpuspec10.csv --out DIR
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path

Row = dict[str, str]


def _shared(r: Row) -> bool:
    return int(r["num_gpu"]) == 1 and 0 < int(r["gpu_milli"]) < 1000


def _whole1(r: Row) -> bool:
    return int(r["num_gpu"]) == 1 and int(r["gpu_milli"]) >= 1000


def _multi(r: Row) -> bool:
    return int(r["num_gpu"]) > 1


def _cpu_only(r: Row) -> bool:
    return int(r["num_gpu"]) == 0


def _req(r: Row) -> int:
    return int(r["num_gpu"]) * min(int(r["gpu_milli"]), 1000)


def _copy(dst: Row, src: Row) -> Row:
    out = dict(dst)
    for k in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"):
        out[k] = src[k]
    return out


def _more_shared(rows: list[Row], share: float, keep_p: float, rng: random.Random) -> list[Row]:
    shared = [r for r in rows if _shared(r)]
    gpu = [r for r in rows if not _cpu_only(r)]
    need = int(share * len(gpu)) - len(shared)
    out = []
    for r in rows:
        if _whole1(r) and need > 0 and rng.random() < keep_p:
            out.append(_copy(r, rng.choice(shared)))
            need -= 1
        else:
            out.append(r)
    return out


def _pinned(rows: list[Row], specs: list[str], p: float, rng: random.Random, only_unpinned: bool) -> list[Row]:
    out = []
    for r in rows:
        r = dict(r)
        if not _cpu_only(r) and (not only_unpinned or not r["gpu_spec"]) and rng.random() < p:
            r["gpu_spec"] = rng.choice(specs)
        out.append(r)
    return out


def variants(rows: list[Row], specs: list[str]) -> dict[str, list[Row]]:
    """The synthetic variants, in the order (and RNG streams) the measurements in docs/sharing.md used."""
    rng = random.Random(7)
    out: dict[str, list[Row]] = {"gpushare70s": _more_shared(rows, 0.70, 0.9, rng)}
    multi = [r for r in rows if _multi(r)]
    rs = [dict(r) for r in rows]
    idx = [i for i, r in enumerate(rs) if int(r["num_gpu"]) == 1]
    rng.shuffle(idx)
    for i in idx:
        total = sum(_req(r) for r in rs)
        if sum(_req(r) for r in rs if _multi(r)) >= 0.45 * total:
            break
        rs[i] = _copy(rs[i], rng.choice(multi))
    out["multigpu45s"] = rs
    cpu_only = [r for r in rows if _cpu_only(r)]
    out["cpu200s"] = rows + [rng.choice(cpu_only) for _ in range(len(cpu_only))]
    out["gpuspec25s"] = _pinned(rows, specs, 0.25, rng, only_unpinned=True)
    rng2 = random.Random(11)
    out["gpuspec35s"] = _pinned(rows, specs, 0.35, rng2, only_unpinned=False)
    out["gpushare85s"] = _more_shared(rows, 0.85, 0.95, rng2)
    # Added later, on their own RNG stream so the variants above stay byte-identical.
    rng3 = random.Random(13)
    out["cpu250s"] = rows + [rng3.choice(cpu_only) for _ in range(len(cpu_only) * 3 // 2)]
    out["cpu300s"] = rows + [rng3.choice(cpu_only) for _ in range(2 * len(cpu_only))]
    out["mem250s"] = _more_memory(rows, 0.35, 2.5, rng3)
    out["multigpu70s"] = _more_multi(rows, multi, 0.70, rng3)
    return out


def _more_memory(rows: list[Row], p: float, factor: float, rng: random.Random) -> list[Row]:
    out = []
    for r in rows:
        r = dict(r)
        if rng.random() < p:
            r["memory_mib"] = str(int(int(r["memory_mib"]) * factor))
        out.append(r)
    return out


def _more_multi(rows: list[Row], multi: list[Row], share: float, rng: random.Random) -> list[Row]:
    """Single-GPU pods replaced by copies of random multi-GPU pods until those ask for ``share`` of
    the GPU milli (totals kept incrementally: the trace has ~8k pods)."""
    rs = [dict(r) for r in rows]
    idx = [i for i, r in enumerate(rs) if int(r["num_gpu"]) == 1]
    rng.shuffle(idx)
    total = sum(_req(r) for r in rs)
    multi_req = sum(_req(r) for r in rs if _multi(r))
    for i in idx:
        if multi_req >= share * total:
            break
        src = rng.choice(multi)
        total += _req(src) - _req(rs[i])
        multi_req += _req(src)
        rs[i] = _copy(rs[i], src)
    return rs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoscaler.benchmarks.fgd.synth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", required=True, help="openb_pod_list_default.csv")
    p.add_argument("--spec-from", required=True, help="a trace with gpu_spec values (openb_pod_list_gpuspec10.csv)")
    p.add_argument("--out", required=True, help="folder for openb_pod_list_<variant>.csv")
    a = p.parse_args(argv)
    with open(a.pods, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(a.spec_from, newline="") as f:
        specs = [r["gpu_spec"] for r in csv.DictReader(f) if r["gpu_spec"] and not _cpu_only(r)]
    header = list(rows[0].keys())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rs in variants(rows, specs).items():
        with open(out / f"openb_pod_list_{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, header)
            w.writeheader()
            for i, r in enumerate(rs):
                w.writerow({**r, "name": f"openb-pod-{i:05d}"})  # unique names: clones would collide
    return 0


if __name__ == "__main__":
    sys.exit(main())
