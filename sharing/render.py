"""Renderers: what a layout becomes in Kubernetes and NVIDIA's tools.

- **mig-parted config** (``version: v1``, ``mig-configs: <name>: [{devices, mig-enabled,
  mig-devices}]``), the file NVIDIA's MIG manager applies; GPUs with the same layout share one entry.
- **node label** ``nvidia.com/mig.config=<name>``, which tells the MIG manager which entry to apply.
- **device-plugin time-slicing config** (``sharing.timeSlicing.resources[].replicas``).
- **pod resource requests**: ``nvidia.com/gpu`` for whole GPUs and time-sliced shares of a plain
  GPU, ``nvidia.com/mig-<profile>`` (mixed strategy) for MIG instances and shares inside one.

Every layout is checked against the GPU model's catalog geometry before it is rendered (legal
starts, no overlapping memory-slice ranges, per-profile counts, compute slices), so a rendered
layout is always one the node's GPU can hold. mig-parted takes counts, not starts; the order we
list profiles in (largest first) is the order it creates them, which lands each at the first free
legal start, the same placement our packer assumes for a fresh GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sharing.catalog import GpuModel
from sharing.slots import Inventory, Slot, SlotKind

GPU_PRODUCT = "nvidia.com/gpu.product"  # GPU Feature Discovery's node label: the GPU kind
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")

Layout = Sequence[tuple[str, int]]  # (profile key or NVIDIA name, start)


class LayoutError(ValueError):
    """A MIG layout the GPU model cannot hold (the message says why)."""


def check_layout(gpu: GpuModel, layout: Layout) -> list[tuple[str, int]]:
    """The layout with canonical profile keys, or :class:`LayoutError`."""
    if not gpu.mig_capable and layout:
        raise LayoutError(f"{gpu.name} does not support MIG")
    used = 0
    compute = 0
    counts: dict[str, int] = {}
    out = []
    for prof, start in layout:
        try:
            p = gpu.profile(prof)
        except KeyError as e:
            raise LayoutError(str(e.args[0])) from None
        if start not in p.placements:
            raise LayoutError(f"{gpu.name}: {p.name} cannot start at slice {start} (legal: {list(p.placements)})")
        mask = ((1 << p.mem_slices) - 1) << start
        if used & mask:
            raise LayoutError(f"{gpu.name}: {p.name}@{start} overlaps another instance")
        used |= mask
        counts[p.key] = counts.get(p.key, 0) + 1
        if counts[p.key] > p.max_count:
            raise LayoutError(f"{gpu.name}: more than {p.max_count} x {p.name}")
        compute += p.compute_slices
        if compute > gpu.compute_slices_total:
            raise LayoutError(f"{gpu.name}: layout needs {compute} compute slices of {gpu.compute_slices_total}")
        out.append((p.key, int(start)))
    return sorted(out, key=lambda x: x[1])


def mig_devices(gpu: GpuModel, layout: Layout) -> dict[str, int]:
    """``mig-devices`` counts by NVIDIA profile name, largest profile first."""
    counts: dict[str, int] = {}
    for key, _ in check_layout(gpu, layout):
        name = gpu.profile(key).name
        counts[name] = counts.get(name, 0) + 1
    order = sorted(counts, key=lambda n: (-gpu.profile(n).mem_slices, -gpu.profile(n).compute_slices, n))
    return {n: counts[n] for n in order}


def mig_parted_config(name: str, gpu: GpuModel, layouts: Mapping[int, Layout | None],
                      device_filter: str | None = None) -> dict[str, Any]:
    """One mig-parted config named ``name`` for a node: ``layouts[i]`` per GPU index (None = MIG off).

    GPUs with identical layouts are grouped into one entry (``devices: [..]``), and a node whose
    GPUs all share one layout gets ``devices: all``.
    """
    check_label_value(name)
    groups: dict[tuple, list[int]] = {}
    devices_of: dict[tuple, dict[str, int]] = {}
    for idx in sorted(layouts):
        lay = layouts[idx]
        counts = None if lay is None else mig_devices(gpu, lay)
        key = ("off",) if counts is None else ("on", tuple(sorted(counts.items())))
        groups.setdefault(key, []).append(int(idx))
        if counts is not None:
            devices_of[key] = counts
    entries = []
    for key, devs in groups.items():
        entry: dict[str, Any] = {}
        if device_filter:
            entry["device-filter"] = [device_filter]
        entry["devices"] = "all" if len(groups) == 1 else devs
        entry["mig-enabled"] = key[0] == "on"
        if key[0] == "on":
            entry["mig-devices"] = devices_of[key]
        entries.append(entry)
    return {"version": "v1", "mig-configs": {name: entries}}


def layouts_from_inventory(inv: Inventory, node: str) -> dict[int, list[tuple[str, int]] | None]:
    """Per GPU of ``node``: its MIG instances (None when MIG is off)."""
    spec = inv.nodes[node]
    out: dict[int, list[tuple[str, int]] | None] = {}
    for i in range(spec.gpu_count):
        d = inv.device(node, i)
        out[i] = list(d.instances()) if d.mig_enabled else None
    return out


def node_mig_config(inv: Inventory, node: str, name: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(mig-parted config, node labels) for a node of the inventory."""
    spec = inv.nodes[node]
    gpu = inv.catalog.get(spec.gpu_model)
    cfg_name = name or f"slotwise-{_slug(node)}"
    cfg = mig_parted_config(cfg_name, gpu, layouts_from_inventory(inv, node),
                            device_filter=gpu.pci_ids[0] if len(gpu.pci_ids) == 1 else None)
    return cfg, mig_config_label(cfg_name)


def mig_config_label(name: str) -> dict[str, str]:
    check_label_value(name)
    return {MIG_CONFIG_LABEL: name}


def check_label_value(value: str) -> None:
    if not _LABEL_VALUE.match(value) or len(value) > 63:
        raise ValueError(f"{value!r} is not a valid Kubernetes label value (<= 63 of [A-Za-z0-9._-], alnum ends)")


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return s[:50] or "node"


def time_slicing_config(replicas: Mapping[str, int], rename_by_default: bool = False,
                        fail_requests_greater_than_one: bool = True) -> dict[str, Any]:
    """Device-plugin config: ``replicas[resource]`` time-sliced replicas per GPU (or per MIG instance)."""
    resources = []
    for res, n in sorted(replicas.items()):
        if not (res == "nvidia.com/gpu" or res.startswith("nvidia.com/mig-")):
            raise ValueError(f"time-slicing applies to nvidia.com/gpu or nvidia.com/mig-*, not {res!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{res}: replicas must be an integer >= 1, got {n!r}")
        resources.append({"name": res, "replicas": n})
    return {
        "version": "v1",
        "sharing": {
            "timeSlicing": {
                "renameByDefault": rename_by_default,
                "failRequestsGreaterThanOne": fail_requests_greater_than_one,
                "resources": resources,
            }
        },
    }


def pod_resources(slot: Slot, gpu: GpuModel) -> dict[str, dict[str, str]]:
    """Container ``resources`` for a replica in ``slot`` (mixed MIG strategy)."""
    if slot.kind is SlotKind.WHOLE:
        n = str(len(slot.devices))
        return {"requests": {"nvidia.com/gpu": n}, "limits": {"nvidia.com/gpu": n}}
    if slot.profile is not None:
        res = gpu.profile(slot.profile).resource_name
    else:
        res = "nvidia.com/gpu"  # one time-sliced replica of a plain GPU
    return {"requests": {res: "1"}, "limits": {res: "1"}}


# -- a small YAML emitter: sharing depends on the stdlib and numpy only ------------------------
_PLAIN = re.compile(r"^[A-Za-z0-9_./-][A-Za-z0-9_./+-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in _RESERVED and not re.match(r"^[0-9.+-]", s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_yaml(obj: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists and scalars (keys and strings quoted when needed)."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if (isinstance(v, Mapping) and v) or (isinstance(v, list) and v and not _flat(v)):
                lines.append(f"{pad}{_scalar(k)}:")
                lines.append(to_yaml(v, indent + 1).rstrip("\n"))
            else:
                lines.append(f"{pad}{_scalar(k)}: {_inline(v)}")
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, Mapping) and v:
                body = to_yaml(v, indent + 1).rstrip("\n").split("\n")
                lines.append(f"{pad}- {body[0].lstrip()}")
                lines.extend(body[1:])
            else:
                lines.append(f"{pad}- {_inline(v)}")
    else:
        lines.append(pad + _scalar(obj))
    return "\n".join(lines) + "\n"


def _flat(v: list) -> bool:
    return all(not isinstance(x, Mapping | list) for x in v)


def _inline(v: Any) -> str:
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_scalar(k)}: {_inline(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_inline(x) for x in v) + "]"
    return _scalar(v)
