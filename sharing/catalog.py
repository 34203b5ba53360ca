"""GPU catalog: what each GPU kind offers (memory, MIG geometry, price, speed).

MIG geometry comes from ``data/mig_profiles.json`` (a copy of the project's ``shared/data`` file,
shipped inside the package so an installed controller needs nothing else). GPUs without MIG (T4,
L4, A10, V100, P100 and the anonymised G2/G3 of the Alibaba GPU trace) come from a small table
below. Prices are rough, documented defaults: every deployment should override them with its own
(:meth:`Catalog.with_prices`). Speeds are published relative throughputs (``data/slot_speeds.json``, with sources).

Memory figures are GiB. NVIDIA's names say "gb" for what are really GiB-ish rounded figures and
the usable memory is a little lower (H100 ``7g.80gb`` reports 79.25 GiB); the live controller should
read ``nvidia.com/mig-<type>.memory`` and size replicas to that, the catalog is the fallback and the
simulator's truth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

_DATA = Path(__file__).resolve().parent / "data" / "mig_profiles.json"

# Price per GPU-hour (USD) by canonical name: rough 2024-25 on-demand list prices of specialised GPU
# clouds (hyperscalers charge up to ~3x more). Only the ratios matter to the packer's cost scoring,
# and reports should use the operator's own numbers (``Catalog.with_prices``).
DEFAULT_PRICES: Mapping[str, float] = MappingProxyType(
    {
        "B300-288GB": 8.00,
        "GB200-186GB": 7.00,
        "B200-180GB": 6.00,
        "H200-141GB": 4.50,
        "H100-96GB": 3.60,
        "H100-NVL-94GB": 3.50,
        "H100-80GB": 3.50,
        "A100-80GB": 2.00,
        "A100-40GB": 1.50,
        "A30-24GB": 0.90,
        "A10-24GB": 1.00,
        "L4-24GB": 0.80,
        "V100-32GB": 1.20,
        "V100-16GB": 1.00,
        "P100-16GB": 0.60,
        "T4-16GB": 0.35,
        "G2": 1.00,
        "G3": 1.00,
    }
)

# Serving throughput relative to H100-80GB = 1.0, from ``data/slot_speeds.json``: published relative throughputs
# (MLPerf Inference ratios, or datasheet compute and bandwidth), each with its source. sharing/slot_speed.py derives
# MIG instances and time-slice shares from these; a model's measured curve on the kind always wins.
_SPEEDS = Path(__file__).resolve().parent / "data" / "slot_speeds.json"
DEFAULT_RELATIVE_SPEED: Mapping[str, float] = MappingProxyType(
    {k: float(v["speed"]) for k, v in json.loads(_SPEEDS.read_text())["gpus"].items()}
)

# Fallbacks for a kind that a newer JSON file adds before these tables know it: price scales with
# memory (roughly what the market does); speed 1.0 is a placeholder until a measured capacity curve
# for that kind takes over.
_FALLBACK_PRICE_PER_GIB = 0.04
_FALLBACK_SPEED = 1.0


@dataclass(frozen=True)
class _PlainGpu:
    name: str
    memory_gib: float
    aliases: tuple[str, ...]


# GPUs without MIG. Memory from the public spec sheets. G2 and G3 are the Alibaba GPU trace's
# anonymised kinds: the trace has no memory column (its pods ask for a compute share, gpu_milli),
# so 32 GiB (V100M32-class) is an assumption that only matters when a memory request meets them.
_PLAIN_GPUS: tuple[_PlainGpu, ...] = (
    _PlainGpu("L4-24GB", 24.0, ("L4",)),
    _PlainGpu("T4-16GB", 16.0, ("T4",)),
    _PlainGpu("A10-24GB", 24.0, ("A10", "A10G")),
    _PlainGpu("V100-32GB", 32.0, ("V100M32",)),
    _PlainGpu("V100-16GB", 16.0, ("V100M16", "V100")),
    _PlainGpu("P100-16GB", 16.0, ("P100",)),
    _PlainGpu("G2", 32.0, ()),
    _PlainGpu("G3", 32.0, ()),
)

# Short names for the MIG-capable kinds in the JSON (its keys are the canonical names, except the
# composite "H100-96GB/GH200/H20", whose first part is canonical and the rest aliases).
_MIG_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "H100-80GB": ("H100",),
        "A100-40GB": ("A100",),
        "A100-80GB": (),
        "H100-NVL-94GB": ("H100-NVL",),
        "H200-141GB": ("H200",),
        "B200-180GB": ("B200",),
        "GB200-186GB": ("GB200",),
        "B300-288GB": ("B300",),
        "A30-24GB": ("A30",),
    }
)

# Tokens of a GFD ``nvidia.com/gpu.product`` label that name a form factor or memory type, not a
# different GPU ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-V100-SXM2-32GB").
_NOISE_TOKENS = frozenset({"SXM", "SXM2", "SXM3", "SXM4", "SXM5", "PCIE", "HBM2", "HBM2E", "HBM3", "HBM3E"})
_MEM_TOKEN = re.compile(r"^\d+GB$")
_NAME_GIB = re.compile(r"\.(\d+(?:\.\d+)?)gb", re.IGNORECASE)


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model.

    An instance occupies memory slices ``[start, start + mem_slices)`` for a ``start`` in
    ``placements``; two instances coexist iff their ranges do not overlap (NVML's rule).
    """

    key: str  # layout key shared by all models of a layout: "1g", "1g.2mem", "3g", "1g+me", ...
    name: str  # NVIDIA's name on this model: "3g.40gb" (the mixed-strategy resource nvidia.com/mig-3g.40gb)
    compute_slices: int
    mem_slices: int
    placements: tuple[int, ...]
    memory_gib: float
    max_count: int
    nvml_id: int = -1

    @property
    def media_extensions(self) -> bool:
        """``+me`` profiles carry the GPU's media engines; at most one exists, keep it for media work."""
        return self.key.endswith("+me")

    @property
    def resource_name(self) -> str:
        return f"nvidia.com/mig-{self.name}"


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gib: float
    mem_slices_total: int  # 8, or 4 for A30; 0 without MIG
    compute_slices_total: int  # 7, or 4 for A30; 0 without MIG
    # Not part of the hash: a mapping is unhashable, and name identifies a model within a catalog.
    profiles: Mapping[str, MigProfile] = field(default_factory=dict, hash=False)
    price_per_hour: float = 0.0
    relative_speed: float = 1.0
    pci_ids: tuple[str, ...] = ()
    placement_source: str = ""

    def __post_init__(self) -> None:
        # Freeze the mapping so a GpuModel shared by many Inventory copies cannot be edited through one.
        if not isinstance(self.profiles, MappingProxyType):
            object.__setattr__(self, "profiles", MappingProxyType(dict(self.profiles)))
        # Sorted once: packers ask for this order on every device they look at.
        ordered = sorted(self.profiles.values(), key=lambda p: (p.memory_gib, p.compute_slices, p.key))
        object.__setattr__(self, "_by_size_all", tuple(ordered))
        object.__setattr__(self, "_by_size", tuple(p for p in ordered if not p.media_extensions))

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles) and self.mem_slices_total > 0

    @property
    def mem_slice_gib(self) -> float:
        """Memory of one memory slice (device memory split evenly); 0 without MIG."""
        return self.memory_gib / self.mem_slices_total if self.mem_slices_total else 0.0

    def profile(self, key_or_name: str) -> MigProfile:
        """A profile by layout key ("3g") or NVIDIA name ("3g.40gb", "mig-3g.40gb", a resource name)."""
        if key_or_name in self.profiles:
            return self.profiles[key_or_name]
        bare = key_or_name.removeprefix("nvidia.com/").removeprefix("mig-")
        for p in self.profiles.values():
            if p.name == bare or p.key == bare:
                return p
        raise KeyError(f"{self.name} has no MIG profile {key_or_name!r}; it has {sorted(self.profiles)}")

    def compute_fraction(self, profile: MigProfile | str) -> float:
        """Fraction of this GPU's compute a profile gets (3g on a 7-slice GPU: 3/7)."""
        p = self.profile(profile) if isinstance(profile, str) else profile
        return p.compute_slices / self.compute_slices_total

    def profiles_by_size(self, include_media: bool = False) -> tuple[MigProfile, ...]:
        """Profiles smallest first (memory, then compute): the order a best-size search wants."""
        return self._by_size_all if include_media else self._by_size  # type: ignore[attr-defined]


def _norm(name: str) -> str:
    return "-".join(t for t in re.split(r"[\s_\-]+", name.strip().upper()) if t)


def _label_candidates(name: str) -> list[str]:
    """Normalised lookup keys for a product name, most specific first.

    "NVIDIA-A100-SXM4-80GB" -> ["A100-SXM4-80GB", "A100-80GB", "A100"]; also drops the
    "-SHARED" (time-slicing) and "-MIG-<profile>" (single strategy) suffixes GFD appends.
    """
    tokens = _norm(name).split("-")
    while tokens and tokens[0] in ("NVIDIA", "TESLA"):
        tokens = tokens[1:]
    if "MIG" in tokens:
        tokens = tokens[: tokens.index("MIG")]
    tokens = [t for t in tokens if t != "SHARED"]
    if not tokens:
        return []
    out = ["-".join(tokens)]
    core = [t for t in tokens if t not in _NOISE_TOKENS]
    out.append("-".join(core))
    mem = [t for t in core[1:] if _MEM_TOKEN.match(t)]
    if mem:
        out.append(f"{core[0]}-{mem[0]}")
    out.append(core[0])
    return out


class Catalog:
    """Immutable set of GPU models with alias lookup. Derive changed copies with ``with_*``."""

    def __init__(self, models: Iterable[GpuModel], aliases: Mapping[str, str] | None = None) -> None:
        self._models: dict[str, GpuModel] = {m.name: m for m in models}
        self._aliases: dict[str, str] = {_norm(n): n for n in self._models}
        for alias, target in (aliases or {}).items():
            if target not in self._models:
                raise ValueError(f"alias {alias!r} points at unknown GPU kind {target!r}")
            self._aliases.setdefault(_norm(alias), target)

    def resolve(self, name: str) -> str:
        """Canonical name for one of ours, an alias, a GFD product label or an Alibaba trace kind."""
        for cand in _label_candidates(name):
            if cand in self._aliases:
                return self._aliases[cand]
        raise KeyError(f"unknown GPU kind {name!r}; known: {', '.join(self.names())}")

    def get(self, name: str) -> GpuModel:
        hit = self._models.get(name)
        return hit if hit is not None else self._models[self.resolve(name)]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.resolve(name)
        except KeyError:
            return False
        return True

    def names(self) -> tuple[str, ...]:
        return tuple(self._models)

    def aliases(self) -> Mapping[str, str]:
        """Normalised alias -> canonical name (read-only)."""
        return MappingProxyType(self._aliases)

    def _with(self, models: Iterable[GpuModel]) -> Catalog:
        new = Catalog.__new__(Catalog)
        new._models = {m.name: m for m in models}
        new._aliases = dict(self._aliases)
        return new

    def with_prices(self, prices: Mapping[str, float]) -> Catalog:
        """A copy with ``price_per_hour`` replaced for the named kinds (any accepted name)."""
        return self.with_overrides({k: {"price_per_hour": v} for k, v in prices.items()})

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> Catalog:
        """A copy with fields replaced per kind, e.g. ``{"T4": {"relative_speed": 0.1}}``.

        Only ``price_per_hour`` and ``relative_speed`` may change: memory and geometry are facts
        the MIG profiles were derived from, so changing them here would silently desync the two.
        """
        allowed = {"price_per_hour", "relative_speed"}
        models = dict(self._models)
        for name, changes in overrides.items():
            bad = set(changes) - allowed
            if bad:
                raise ValueError(f"cannot override {sorted(bad)} of {name!r}; only {sorted(allowed)}")
            for k, v in changes.items():
                if not isinstance(v, int | float) or v < 0:
                    raise ValueError(f"{name!r}: {k} must be a non-negative number, got {v!r}")
            canon = self.resolve(name)
            models[canon] = replace(models[canon], **{k: float(v) for k, v in changes.items()})
        return self._with(models.values())

    def with_model(self, model: GpuModel, aliases: Iterable[str] = ()) -> Catalog:
        """A copy that also knows ``model`` (e.g. a GPU whose MIG table was read from NVML)."""
        new = self._with([*self._models.values(), model])
        new._aliases[_norm(model.name)] = model.name
        for a in aliases:
            new._aliases[_norm(a)] = model.name
        return new


def _profile_memory(name: str, mem_slices: int, model_mem: float, mem_slices_total: int) -> float:
    """GiB a profile gives: the nominal figure in its NVIDIA name ("3g.40gb" -> 40), capped at its
    proportional share of the device.

    The cap matters where the names are rounded up (H200 ``1g.18gb`` x 8 = 144 > 141, two
    ``3g.71gb`` = 142 > 141): without it instances could sum past the device. Where names are exact
    (A100, H100, A30) the two agree. Usable memory is a bit lower still; see the module docstring.
    """
    share = model_mem * mem_slices / mem_slices_total
    m = _NAME_GIB.search(name)
    nominal = float(m.group(1)) if m else share
    return min(nominal, share)


def _model_memory(key: str, names: Mapping[str, str]) -> float:
    m = re.search(r"(\d+)GB", key)
    if m:
        return float(m.group(1))
    # No memory in the key: the largest profile's nominal name is the whole device.
    return max(float(_NAME_GIB.search(n).group(1)) for n in names.values() if _NAME_GIB.search(n))  # type: ignore[union-attr]


def _build(data: Mapping[str, Any]) -> Catalog:
    models: list[GpuModel] = []
    aliases: dict[str, str] = {}
    for key, spec in data["models"].items():
        canonical, *extra = key.split("/")
        layout: Mapping[str, Mapping[str, Any]] = data[spec["layout"]]
        names: Mapping[str, str] = spec["names"]
        mem_total = max(p["placements"][-1] + p["size"] for p in layout.values())
        compute_total = max(p["slices_c"] for p in layout.values())
        memory = _model_memory(canonical, names)
        profiles = {}
        for pkey, p in layout.items():
            if pkey not in names:  # a layout profile this model does not offer
                continue
            profiles[pkey] = MigProfile(
                key=pkey,
                name=names[pkey],
                compute_slices=int(p["slices_c"]),
                mem_slices=int(p["mem_slices"]),
                placements=tuple(int(s) for s in p["placements"]),
                memory_gib=_profile_memory(names[pkey], int(p["mem_slices"]), memory, mem_total),
                max_count=int(p["max"]),
                nvml_id=int(p.get("nvml_id", -1)),
            )
        models.append(
            GpuModel(
                name=canonical,
                memory_gib=memory,
                mem_slices_total=mem_total,
                compute_slices_total=compute_total,
                profiles=profiles,
                price_per_hour=DEFAULT_PRICES.get(canonical, _FALLBACK_PRICE_PER_GIB * memory),
                relative_speed=DEFAULT_RELATIVE_SPEED.get(canonical, _FALLBACK_SPEED),
                pci_ids=tuple(spec.get("pci_ids", ())),
                placement_source=spec.get("placement_source", ""),
            )
        )
        for a in (*extra, *_MIG_ALIASES.get(canonical, ())):
            aliases[a] = canonical
    for g in _PLAIN_GPUS:
        models.append(
            GpuModel(
                name=g.name,
                memory_gib=g.memory_gib,
                mem_slices_total=0,
                compute_slices_total=0,
                profiles={},
                price_per_hour=DEFAULT_PRICES.get(g.name, _FALLBACK_PRICE_PER_GIB * g.memory_gib),
                relative_speed=DEFAULT_RELATIVE_SPEED.get(g.name, _FALLBACK_SPEED),
            )
        )
        for a in g.aliases:
            aliases[a] = g.name
    return Catalog(models, aliases)


@lru_cache(maxsize=1)
def _default_catalog() -> Catalog:
    return _build(json.loads(_DATA.read_text()))


def load_catalog(path: str | None = None) -> Catalog:
    """The catalog from a MIG-profiles JSON file (default: the copy bundled in ``sharing/data``).

    The default is built once and shared: a Catalog is immutable.
    """
    if path is None:
        return _default_catalog()
    return _build(json.loads(Path(path).read_text()))
