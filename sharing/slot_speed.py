"""Slot speeds: how fast one replica serves on its slot, relative to the reference GPU.

The reference is the H100-80GB (SXM), :data:`REFERENCE_GPU`: a model's service-time annotations
(``service-time-ms``, ``prefill-ms-per-1k-tokens``, ``decode-ms-per-token``) describe one replica on whole reference
GPUs (as many as ``gpus-per-replica`` asks), or, for a model that asks for part of a GPU (``gpu-compute-share``
``c < 1``), on that share of one. A replica of speed ``s`` takes ``1/s`` times as long per request -- occupancy and the
latency part alike -- so ``s`` of them do the work of one reference replica.

Where the numbers come from (``data/slot_speeds.json``, every entry with its source; docs/sharing.md "Slot speeds"):

- a whole GPU: the kind's published relative throughput. Measured MLPerf Inference ratios where the same round has
  the same submitter and LLM benchmark on both kinds (L4: GPT-J 0.0995 of an H100), else the blend
  ``sqrt(dense FP16 ratio x memory bandwidth ratio)`` of the datasheets (LLM prefill is compute-bound, decode
  bandwidth-bound). The catalog's ``GpuModel.relative_speed`` is read from the same file (so
  ``Catalog.with_overrides`` changes it here too);
- a MIG instance of ``c`` of ``C`` compute slices and ``m`` of ``M`` memory slices: the GPU's speed x
  ``sqrt(c/C x m/M)`` (each compute slice is 1/7 of the SMs; each memory slice brings its own memory controllers, so
  bandwidth follows memory), e.g. H100 3g.40gb: ``sqrt(3/7 x 4/8) = 0.463``;
- a time-slice share ``s`` of a GPU: ``s`` x the GPU's speed; inside a MIG instance of compute fraction ``f``:
  ``s/f`` x the instance's speed (the co-tenants' idle time is not counted on).

A replica's speed is its slot's table speed (in whole reference GPUs) over the share ``c`` its service times describe:
``table_speed / c`` for a whole-GPU model (``c = 1``: an H200 serves it 1.2x faster), and ``min(1, table_speed / c)``
for a fractional one -- served as declared on any slot that gives it at least its share of an H100, proportionally
slower on one that gives it less (a 0.25 share of an L4: 0.0995), never faster (it asked for no more). A model's
``slotwise.io/slot-speeds`` entries override all of this for the kinds they match (:func:`declared_speed`: the whole
key, else the slot type, else the GPU model), with the same meaning: relative to what its service times describe.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

from sharing.catalog import Catalog, load_catalog
from sharing.slots import Slot, SlotKind

_DATA = Path(__file__).resolve().parent / "data" / "slot_speeds.json"
REFERENCE_GPU = "H100-80GB"  # the table's 1.0, and what service-time annotations describe unless slot-speeds says


@dataclass(frozen=True)
class GpuSpeed:
    """One row of the table: a whole GPU's speed and where it comes from."""

    name: str
    speed: float
    basis: str  # "reference", "blend" (datasheets), "mlperf" (measured ratio) or "assumed" (see note)
    fp16_dense_tflops: float
    memory_tbps: float
    source: str
    note: str = ""


def blend(compute_ratio: float, bandwidth_ratio: float) -> float:
    """The speed of hardware with these compute and memory-bandwidth ratios: their geometric mean (equal weight
    in log space for the compute-bound prefill and the bandwidth-bound decode of an LLM request)."""
    return math.sqrt(compute_ratio * bandwidth_ratio)


@lru_cache(maxsize=1)
def gpu_speeds() -> Mapping[str, GpuSpeed]:
    """The table of whole-GPU speeds by catalog name (read-only, read once)."""
    doc = json.loads(_DATA.read_text())
    return MappingProxyType({
        name: GpuSpeed(name, float(v["speed"]), str(v["basis"]), float(v["fp16_dense_tflops"]),
                       float(v["memory_tbps"]), str(v["source"]), str(v.get("note", "")))
        for name, v in doc["gpus"].items()
    })


def slot_type(slot: Slot) -> str:
    """``whole``, the MIG profile's NVIDIA name (``3g.40gb``), ``share`` or ``<profile>/share``: the part after the
    GPU model in a slot-kind key (``H100-80GB/3g.40gb``, the key the capacity model learns per)."""
    if slot.kind is SlotKind.WHOLE:
        return "whole"
    if slot.kind is SlotKind.MIG:
        return str(slot.profile_name())
    return "share" if slot.profile is None else f"{slot.profile_name()}/share"


def _names_gpu(entry: str, gpu_model: str, catalog: Catalog) -> bool:
    if entry.casefold() == gpu_model.casefold():
        return True
    try:
        return catalog.resolve(entry) == gpu_model  # aliases: "L4", "H100", GFD product labels
    except KeyError:
        return False


def declared_speed(kind: str, entries: tuple[tuple[str, float], ...], catalog: Catalog | None = None) -> float | None:
    """The speed ``slotwise.io/slot-speeds`` declares for slot kind ``kind`` (``<gpu model>/<slot type>``): the entry
    equal to the whole key, else the first equal to its slot type, else the first naming its GPU model (canonical
    name or catalog alias); case-insensitive. None when no entry matches (docs/annotations.md, "Slot speeds")."""
    if not entries:
        return None
    cat = catalog or load_catalog()
    gpu_model, _, stype = kind.partition("/")
    whole_key, stype = kind.casefold(), stype.casefold()
    by_type: float | None = None
    by_gpu: float | None = None
    for entry, speed in entries:
        e = entry.casefold()
        if e == whole_key:
            return speed
        if e == stype:
            if by_type is None:
                by_type = speed
        elif by_gpu is None and "/" not in e and _names_gpu(entry, gpu_model, cat):
            by_gpu = speed
    return by_type if by_type is not None else by_gpu


def table_speed(slot: Slot, catalog: Catalog | None = None) -> float:
    """The published speed of ``slot`` (module docstring): the GPU's, scaled for a MIG instance or a share."""
    gpu = (catalog or load_catalog()).get(slot.gpu_model)
    speed = gpu.relative_speed
    container = 1.0  # compute fraction of what a share time-slices: the GPU, or its MIG instance
    if slot.profile is not None and gpu.mig_capable:
        p = gpu.profile(slot.profile)
        container = p.compute_slices / gpu.compute_slices_total
        speed *= blend(container, p.mem_slices / gpu.mem_slices_total)
    if slot.kind is SlotKind.SHARE:
        speed *= min(1.0, slot.compute_fraction / container)
    return speed


def speed_of(
    slot: Slot,
    entries: tuple[tuple[str, float], ...] = (),
    catalog: Catalog | None = None,
    compute_share: float = 1.0,
) -> float:
    """How fast a replica serves on ``slot`` relative to what its service times describe (module docstring): the
    model's declared speed for the slot's kind (``spec.slot_speeds``) if an entry matches, else :func:`table_speed`
    over ``compute_share`` (``spec.gpu_compute_share``; capped at 1 below a whole GPU). Sizing for this slot is sizing
    with the model's profile scaled by ``1 / speed`` (``ServiceProfile.scaled``).
    :func:`autoscaler.api.spec.replica_speed` passes a spec's two fields."""
    declared = declared_speed(f"{slot.gpu_model}/{slot_type(slot)}", entries, catalog)
    if declared is not None:
        return declared
    speed = table_speed(slot, catalog)
    return speed if compute_share >= 1.0 else min(1.0, speed / compute_share)
