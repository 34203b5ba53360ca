"""Slots (what one replica gets on a GPU) and the Inventory that accounts for them, hard.

One module: a Slot is legal only as the Inventory accounts for it (memory hard, MIG placements, compute caps),
and every mutation changes the per-device states, their signatures and the packer's indexes together, so the
slot types and their accounting stay side by side.

Three kinds of slot:

- **whole**: one or more entire GPUs of one node.
- **mig**: one MIG GPU instance ``(profile, start)``, owned exclusively. Instances are created on
  demand on free memory-slice ranges and disappear when released, unless pinned (pre-existing
  layout, :meth:`Inventory.create_mig_instance`).
- **share**: a time-sliced share of a non-MIG GPU, or of a MIG instance (``profile``/``start``
  set). Time-slicing has no memory isolation, so memory is accounted hard here: the shares' memory
  plus ``share_reserve_gib`` (once per shared GPU or instance: CUDA contexts, allocator slack)
  never exceeds the device's, or the instance's, memory. Compute is soft in reality; here it is
  capped at ``max_compute_oversubscription`` times the GPU (or instance) compute.

``compute_fraction`` is always a fraction of one whole GPU's compute (a 3g on a 7-slice GPU is
3/7; a share inside it at most 3/7 times the oversubscription); a whole slot of n GPUs has n.

The Inventory's state is one frozen :class:`DeviceState` per GPU in a dict, so :meth:`copy` is a
shallow dict copy (copy-on-write per device): cheap enough for every controller tick at thousands
of GPUs, and copies never see each other's changes. The Inventory also keeps the indexes a packer
reads instead of scanning every device (devices grouped by state, each model's devices), updated by
every mutation and shared copy-on-write by copies.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType

from sharing.catalog import Catalog, GpuModel, MigProfile, load_catalog

_EPS = 1e-9


class SlotKind(StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    SHARE = "share"


class AllocationError(ValueError):
    """An allocation that would break the inventory's rules (the message says which)."""


def _fmt_gib(x: float) -> str:
    return f"{x:g}GiB"


@dataclass(frozen=True)
class Slot:
    node: str
    devices: tuple[int, ...]  # GPU indices on the node; more than one only for multi-GPU whole slots
    kind: SlotKind
    gpu_model: str  # canonical catalog name
    profile: str | None  # MIG profile key ("3g") for MIG slots and for shares inside a MIG instance
    start: int | None  # MIG placement start (memory-slice index)
    memory_gib: float  # memory this slot gives the replica
    compute_fraction: float  # fraction of one GPU's compute (n for a whole slot of n GPUs)
    # The pod's host requests (CPU in millicores, host memory in GiB), accounted once per slot against its node's
    # capacity (NodeSpec.cpu_millis / host_memory_gib) when the node declares one. 0 = nothing asked.
    cpu_millis: int = 0
    host_memory_gib: float = 0.0

    def __post_init__(self) -> None:
        # Malformed slots fail here; slots that are well-formed but illegal for a cluster state
        # fail in Inventory.allocate, which knows the state.
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        object.__setattr__(self, "kind", SlotKind(self.kind))
        if not self.devices:
            raise ValueError("a slot needs at least one device")
        if len(self.devices) > 1 and self.kind is not SlotKind.WHOLE:
            raise ValueError(f"only whole slots span several GPUs, not {self.kind}")
        if (self.profile is None) != (self.start is None):
            raise ValueError("profile and start are set together (a MIG instance) or not at all")
        if self.kind is SlotKind.MIG and self.profile is None:
            raise ValueError("a mig slot needs a profile and start")
        if self.kind is SlotKind.WHOLE and self.profile is not None:
            raise ValueError("a whole slot has no MIG profile")
        if not (math.isfinite(self.memory_gib) and self.memory_gib > 0):
            raise ValueError(f"memory_gib must be positive, got {self.memory_gib!r}")
        if not (math.isfinite(self.compute_fraction) and self.compute_fraction > 0):
            raise ValueError(f"compute_fraction must be positive, got {self.compute_fraction!r}")
        _check_host(self.cpu_millis, self.host_memory_gib, "slot")

    def with_host(self, cpu_millis: int, host_memory_gib: float) -> Slot:
        """This slot carrying a pod's host requests (the same slot when they are already these)."""
        if cpu_millis == self.cpu_millis and host_memory_gib == self.host_memory_gib:
            return self
        return replace(self, cpu_millis=cpu_millis, host_memory_gib=host_memory_gib)

    @property
    def asks_host(self) -> bool:
        return self.cpu_millis > 0 or self.host_memory_gib > 0

    # -- constructors that get the derived numbers right ------------------------------------
    @classmethod
    def whole(cls, node: str, devices: Sequence[int] | int, gpu: GpuModel) -> Slot:
        devs = (devices,) if isinstance(devices, int) else tuple(devices)
        return cls(node, devs, SlotKind.WHOLE, gpu.name, None, None, gpu.memory_gib * len(devs), float(len(devs)))

    @classmethod
    def mig(cls, node: str, device: int, gpu: GpuModel, profile: str, start: int) -> Slot:
        p = gpu.profile(profile)
        return cls(node, (device,), SlotKind.MIG, gpu.name, p.key, start, p.memory_gib, gpu.compute_fraction(p))

    @classmethod
    def share(
        cls,
        node: str,
        device: int,
        gpu: GpuModel,
        memory_gib: float,
        compute_fraction: float,
        profile: str | None = None,
        start: int | None = None,
    ) -> Slot:
        key = gpu.profile(profile).key if profile is not None else None
        return cls(node, (device,), SlotKind.SHARE, gpu.name, key, start, memory_gib, compute_fraction)

    # -- views ----------------------------------------------------------------------------
    @property
    def gpu_fraction(self) -> float:
        """The share of GPUs this slot costs: n for whole, the compute fraction otherwise."""
        if self.kind is SlotKind.WHOLE:
            return float(len(self.devices))
        return self.compute_fraction

    @property
    def instance(self) -> tuple[str, int] | None:
        """The MIG instance ``(profile, start)`` this slot lives in, if any."""
        return (self.profile, self.start) if self.profile is not None and self.start is not None else None

    def profile_name(self) -> str | None:
        """NVIDIA's name for the profile on this GPU ("3g.40gb"), from the default catalog."""
        if self.profile is None:
            return None
        try:
            return load_catalog().get(self.gpu_model).profile(self.profile).name
        except KeyError:
            return self.profile

    def describe(self) -> str:
        """One line for plans and logs, e.g. ``node-3/gpu1 mig 3g.40gb@4``."""
        where = f"{self.node}/gpu{','.join(str(d) for d in self.devices)}"
        match self.kind:
            case SlotKind.WHOLE:
                n = len(self.devices)
                return f"{where} whole {f'{n}x' if n > 1 else ''}{self.gpu_model}" + self._host_text()
            case SlotKind.MIG:
                return f"{where} mig {self.profile_name()}@{self.start}" + self._host_text()
            case _:
                inside = f" in {self.profile_name()}@{self.start}" if self.profile is not None else ""
                return (
                    f"{where} share {_fmt_gib(self.memory_gib)} "
                    f"compute {self.compute_fraction:.3g}{inside} ({self.gpu_model})"
                ) + self._host_text()

    def _host_text(self) -> str:
        if not self.asks_host:
            return ""
        return f" host {self.cpu_millis}m cpu {_fmt_gib(self.host_memory_gib)}"

    def sort_key(self) -> tuple:
        return (
            self.node,
            self.devices,
            self.kind.value,
            self.profile or "",
            -1 if self.start is None else self.start,
            self.memory_gib,
            self.compute_fraction,
            self.cpu_millis,
            self.host_memory_gib,
        )


def _check_host(cpu_millis: int, host_memory_gib: float, what: str) -> None:
    if isinstance(cpu_millis, bool) or not isinstance(cpu_millis, int) or cpu_millis < 0:
        raise ValueError(f"{what}: cpu_millis must be a whole number >= 0, got {cpu_millis!r}")
    if not (math.isfinite(host_memory_gib) and host_memory_gib >= 0):
        raise ValueError(f"{what}: host_memory_gib must be >= 0, got {host_memory_gib!r}")


@dataclass(frozen=True)
class NodeSpec:
    """A GPU node. ``cpu_millis`` / ``host_memory_gib``: the host CPU (millicores) and memory (GiB) available to
    the slots on it (on Kubernetes the Node's allocatable); None = not accounted (no host check on that node)."""

    name: str
    gpu_model: str
    gpu_count: int
    mig_enabled: bool = False
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    cpu_millis: int | None = None
    host_memory_gib: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        _check_host(0 if self.cpu_millis is None else self.cpu_millis,
                    0.0 if self.host_memory_gib is None else self.host_memory_gib, f"node {self.name!r}")

    @property
    def host_accounted(self) -> bool:
        return self.cpu_millis is not None or self.host_memory_gib is not None


_KIND_VALUES = frozenset(k.value for k in SlotKind)


@dataclass(frozen=True)
class SlotRequest:
    """What one replica needs.

    ``memory_gib`` None asks for ``gpus`` whole GPUs. With a memory figure and ``gpus`` > 1 it is the
    replica's total, spread over ``gpus`` whole GPUs. ``compute_fraction`` is of one GPU: a MIG
    profile is only chosen if its compute share is at least that, so the default 1.0 admits only
    full-GPU instances; callers wanting small slices say how little compute they need.
    ``gpu_models`` optionally restricts GPU kinds (any accepted name); empty means any.
    ``cpu_millis`` / ``host_memory_gib``: the pod's host requests (its containers' CPU and memory requests), which
    the slot carries and its node must have room for (where the node declares host capacity).
    """

    model: str
    memory_gib: float | None
    compute_fraction: float = 1.0
    gpus: int = 1
    kinds: tuple[str, ...] = ("whole", "mig", "share")
    gpu_models: tuple[str, ...] = ()
    cpu_millis: int = 0
    host_memory_gib: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(str(k) for k in self.kinds))
        bad = [k for k in self.kinds if k not in _KIND_VALUES]
        if bad:
            raise ValueError(f"unknown slot kind(s) {bad}; use {sorted(_KIND_VALUES)}")
        if self.memory_gib is not None and not (math.isfinite(self.memory_gib) and self.memory_gib > 0):
            raise ValueError(f"memory_gib must be positive or None, got {self.memory_gib!r}")
        if not (math.isfinite(self.compute_fraction) and self.compute_fraction > 0):
            raise ValueError(f"compute_fraction must be positive, got {self.compute_fraction!r}")
        if self.gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {self.gpus}")
        _check_host(self.cpu_millis, self.host_memory_gib, f"request of {self.model!r}")

    @property
    def asks_host(self) -> bool:
        return self.cpu_millis > 0 or self.host_memory_gib > 0

    @property
    def gpu_fraction(self) -> float:
        """GPUs one pod of this request takes: ``gpus`` for whole GPUs, else its compute fraction."""
        return float(self.gpus) if self.whole_only else self.compute_fraction

    @property
    def whole_only(self) -> bool:
        """True when only whole GPUs can serve it (no memory figure, several GPUs, or kinds say so)."""
        return self.memory_gib is None or self.gpus > 1 or set(self.kinds) <= {"whole"}


@dataclass(frozen=True)
class DeviceState:
    """One GPU's allocation state. Frozen: the Inventory replaces it on change (copy-on-write)."""

    node: str
    index: int
    gpu_model: str
    memory_gib: float
    mig_enabled: bool
    # The model's geometry travels with the state so summaries need no catalog lookup; it is
    # determined by gpu_model, hence left out of comparisons.
    gpu: GpuModel = field(compare=False, repr=False)
    entries: tuple[tuple[str, Slot], ...] = ()  # (owner, slot), kept sorted so equal states compare equal
    pinned: tuple[tuple[str, int], ...] = ()  # MIG instances that exist with or without occupants

    # Summaries are cached per state object: states are immutable and replaced on change, so a
    # cache can never go stale, and the packer's scans over thousands of GPUs stay cheap.
    @property
    def in_use(self) -> bool:
        return bool(self.entries)

    @property
    def idle(self) -> bool:
        """No allocation and no MIG instance: a whole-GPU slot can take it."""
        return not self.entries and not self.pinned

    @cached_property
    def whole_owner(self) -> str | None:
        for owner, s in self.entries:
            if s.kind is SlotKind.WHOLE:
                return owner
        return None

    @cached_property
    def _layout(self) -> tuple[tuple[str, int], ...]:
        live = {s.instance for _, s in self.entries if s.instance is not None}
        return tuple(sorted(live.union(self.pinned), key=lambda ps: (ps[1], ps[0])))

    def instances(self) -> tuple[tuple[str, int], ...]:
        """MIG instances present: pinned ones plus those created on demand for occupants, by start."""
        return self._layout

    @cached_property
    def usage(self) -> Mapping[tuple[str, int] | None, InstanceUsage]:
        """Per MIG instance (None: the plain GPU) what its occupants use; absent = no occupant."""
        acc: dict[tuple[str, int] | None, list[float]] = {}
        for _, s in self.entries:
            if s.kind is SlotKind.WHOLE:
                continue
            u = acc.setdefault(s.instance, [0.0, 0.0, 0, 0])
            if s.kind is SlotKind.MIG:
                u[2] += 1
            else:
                u[0] += s.memory_gib
                u[1] += s.compute_fraction
                u[3] += 1
        return MappingProxyType({k: InstanceUsage(v[0], v[1], int(v[2]), int(v[3])) for k, v in acc.items()})

    @cached_property
    def occupied_mask(self) -> int:
        """Bit i set = memory slice i belongs to some MIG instance."""
        m = 0
        for key, start in self._layout:
            m |= _mask(start, self.gpu.profiles[key].mem_slices)
        return m

    @cached_property
    def mig_compute_used(self) -> int:
        return sum(self.gpu.profiles[k].compute_slices for k, _ in self._layout)

    def profile_count(self, key: str) -> int:
        return sum(1 for k, _ in self._layout if k == key)

    def occupants(self, instance: tuple[str, int]) -> list[tuple[str, Slot]]:
        return [(o, s) for o, s in self.entries if s.instance == instance]

    @cached_property
    def signature(self) -> DeviceSignature:
        """Everything about this state except which GPU it is (see :class:`DeviceSignature`)."""
        usage = self.usage
        sig = DeviceSignature(
            self.gpu,
            (
                self.gpu_model,
                self.memory_gib,
                self.mig_enabled,
                not self.entries and not self.pinned,
                self.whole_owner is not None,
                self._layout,
                tuple(usage.items()) if usage else (),
            ),
        )
        # Interned, so that the index's and the packer's lookups mostly compare by identity.
        hit = _SIGNATURES.get(sig)
        if hit is not None:
            return hit
        if len(_SIGNATURES) > 100_000:  # device states are few; the bound only guards very long runs
            _SIGNATURES.clear()
        _SIGNATURES[sig] = sig
        return sig

    def can_create(self, p: MigProfile, start: int) -> bool:
        """Whether instance ``(p, start)`` could be created now (no overlap, counts, compute)."""
        return (
            start in p.placements
            and start + p.mem_slices <= self.gpu.mem_slices_total
            and not self.occupied_mask & _mask(start, p.mem_slices)
            and self.profile_count(p.key) < p.max_count
            and self.mig_compute_used + p.compute_slices <= self.gpu.compute_slices_total
        )


class DeviceSignature:
    """A device state less its identity: GPU kind, MIG mode, idle, held whole, MIG layout and per-instance
    usage (in the state's own order).

    Two devices with equal signatures offer exactly the same slots (up to node and index) and score the
    same in a packer, so the Inventory groups its devices by signature (:meth:`Inventory.device_groups`)
    and a packer can evaluate one device per group. Hashable, with the hash computed once; the GPU model
    is compared by identity (one catalog object per kind).
    """

    __slots__ = ("_hash", "gpu", "idle", "key")

    def __init__(self, gpu: GpuModel, key: tuple) -> None:
        self.gpu = gpu
        self.key = key
        self.idle: bool = key[3]  # no allocation and no MIG instance
        self._hash = hash((id(gpu), key))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DeviceSignature):
            return NotImplemented
        return self._hash == other._hash and self.gpu is other.gpu and self.key == other.key

    def __repr__(self) -> str:
        return f"DeviceSignature{self.key!r}"


_SIGNATURES: dict[DeviceSignature, DeviceSignature] = {}


@dataclass(frozen=True)
class InstanceUsage:
    share_memory_gib: float
    share_compute: float
    exclusive: int  # MIG slots (0 or 1)
    shares: int


_NO_COUNTS: Mapping[tuple[str, int], int] = MappingProxyType({})


def _entry_key(e: tuple[str, Slot]) -> tuple:
    return (e[0], e[1].sort_key())


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


# Owner names the project writes: the decision core's "<model>-<seq>" and place_batch's
# "<model>/<i>" (".<n>" appended on a clash). Anything else is its own model.
_OWNER_NAME = re.compile(r"^(?P<model>.+?)(?:-\d+|/\d+(?:\.\d+)?)$")


def model_from_owner(owner: str) -> str:
    """The model an owner name belongs to, read from the naming convention (fallback: the owner)."""
    m = _OWNER_NAME.match(owner)
    return m["model"] if m else owner


class Inventory:
    """GPU devices of a cluster and what is allocated on them, with hard legality checks.

    Mutating methods (allocate, release, create/destroy MIG instance, set MIG mode) check first and
    change nothing when they raise.
    """

    def __init__(
        self,
        nodes: Mapping[str, NodeSpec],
        devices: dict[tuple[str, int], DeviceState],
        catalog: Catalog,
        share_reserve_gib: float,
        max_compute_oversubscription: float,
        owner_models: dict[str, tuple[str, int]] | None = None,
        *,
        _index: tuple | None = None,
        _host: tuple | None = None,
    ) -> None:
        # Use from_nodes or copy; this constructor trusts its arguments.
        self._nodes = nodes
        self._devices = devices
        self._catalog = catalog
        self._reserve = share_reserve_gib
        self._oversub = max_compute_oversubscription
        # owner -> (model, live slot count), for owners allocated with an explicit model. The
        # count lets release forget the owner once its last slot goes, so a reused owner name
        # never inherits a stale model. Derived data: left out of __eq__.
        self._owner_models: dict[str, tuple[str, int]] = owner_models if owner_models is not None else {}
        # Indexes for the packer, kept up to date by every mutation (derived data, left out of __eq__):
        # - _pos / _keys / _node_of / _kind_nodes (static, shared by copies): each device's position in
        #   inventory order (nodes in order, then GPU index), the device at a position, the ordinal of
        #   its node, and the number of nodes with GPUs per kind;
        # - _groups: kind -> DeviceSignature -> sorted positions of the devices in that state (lists are
        #   never changed in place, so copies share them until one side changes a group);
        # - _model_devs: model -> {(node, index): entries of the model's owners on that device} and
        #   _model_allocs: model -> allocations (inner dicts replaced on change, shared by copies).
        if _index is None:
            _index = self._build_index()
        (
            self._pos,
            self._keys,
            self._node_of,
            self._kind_nodes,
            self._groups,
            self._model_devs,
            self._model_allocs,
        ) = _index
        # Host CPU/memory held per node (cpu millis, memory GiB; only nodes where something is held): by the slots
        # (derived from the entries) plus _host_held, what pods without a GPU slot hold (:meth:`hold_host`); and
        # the slots' totals (cpu, memory, GPUs by gpu_fraction) -- what a packer learns the GPU workload's host
        # resources per GPU from (sharing/host_resources.py). Small: a copy copies the per-node dicts.
        if _host is None:
            _host = self._build_host()
        self._host_used, self._host_totals, self._host_on, self._host_held = _host
        # node -> free GPU capacity (:meth:`free_gpu_capacity`), filled on demand, dropped when a device of the
        # node changes (derived data).
        self._node_free: dict[str, float] = {}
        self._node_idle: dict[str, int] = {}  # node -> idle GPUs, the same way
        self._kind_lists: dict[str, tuple[str, ...]] | None = None  # kind -> its nodes in order (static)
        self._kind_gpus: tuple[tuple[str, int], ...] | None = None  # (kind, GPUs) (static)
        # kind -> its nodes' host state as arrays (:meth:`kind_host_table`), and the nodes changed since it was read
        # (derived data: a copy starts without them)
        self._tables: dict[str, KindHostTable] = {}
        self._stale_rows: dict[str, set[str]] = {}

    def _build_host(self) -> tuple:
        used: dict[str, tuple[int, float]] = {}
        cpu, mem, gpus = 0, 0.0, 0.0
        for _, s in self.allocations():
            if s.asks_host:
                c, m = used.get(s.node, (0, 0.0))
                used[s.node] = (c + s.cpu_millis, m + s.host_memory_gib)
            cpu, mem, gpus = cpu + s.cpu_millis, mem + s.host_memory_gib, gpus + s.gpu_fraction
        return used, (cpu, mem, gpus), any(n.host_accounted for n in self._nodes.values()), {}

    def _build_index(self) -> tuple:
        pos: dict[tuple[str, int], int] = {}
        keys: list[tuple[str, int]] = []
        node_of: list[int] = []
        kind_nodes: dict[str, int] = {}
        for ordinal, node in enumerate(self._nodes.values()):
            if node.gpu_count:
                kind_nodes[node.gpu_model] = kind_nodes.get(node.gpu_model, 0) + 1
            for i in range(node.gpu_count):
                pos[(node.name, i)] = len(keys)
                keys.append((node.name, i))
                node_of.append(ordinal)
        groups: dict[str, dict[DeviceSignature, list[int]]] = {}
        model_devs: dict[str, dict[tuple[str, int], int]] = {}
        model_allocs: dict[str, int] = {}
        for p, key in enumerate(keys):
            d = self._devices[key]
            groups.setdefault(d.gpu_model, {}).setdefault(d.signature, []).append(p)
            for owner, s in d.entries:
                m = self.model_of(owner)
                per = model_devs.setdefault(m, {})
                per[key] = per.get(key, 0) + 1
                if s.devices[0] == key[1]:
                    model_allocs[m] = model_allocs.get(m, 0) + 1
        return (
            MappingProxyType(pos),
            tuple(keys),
            tuple(node_of),
            MappingProxyType(kind_nodes),
            groups,
            model_devs,
            model_allocs,
        )

    @classmethod
    def from_nodes(
        cls,
        nodes: Sequence[NodeSpec],
        catalog: Catalog | None = None,
        share_reserve_gib: float = 1.0,
        max_compute_oversubscription: float = 1.0,
    ) -> Inventory:
        cat = catalog if catalog is not None else load_catalog()
        if share_reserve_gib < 0 or not math.isfinite(share_reserve_gib):
            raise ValueError(f"share_reserve_gib must be >= 0, got {share_reserve_gib!r}")
        if not (max_compute_oversubscription > 0 and math.isfinite(max_compute_oversubscription)):
            raise ValueError(f"max_compute_oversubscription must be > 0, got {max_compute_oversubscription!r}")
        by_name: dict[str, NodeSpec] = {}
        devices: dict[tuple[str, int], DeviceState] = {}
        for n in nodes:
            if n.name in by_name:
                raise ValueError(f"duplicate node name {n.name!r}")
            if n.gpu_count < 0:
                raise ValueError(f"node {n.name!r}: gpu_count must be >= 0, got {n.gpu_count}")
            gpu = cat.get(n.gpu_model)
            if n.mig_enabled and not gpu.mig_capable:
                raise ValueError(f"node {n.name!r}: {gpu.name} does not support MIG")
            spec = replace(n, gpu_model=gpu.name)  # canonical name, so slots compare by one spelling
            by_name[n.name] = spec
            for i in range(n.gpu_count):
                devices[(n.name, i)] = DeviceState(n.name, i, gpu.name, gpu.memory_gib, n.mig_enabled, gpu)
        return cls(MappingProxyType(by_name), devices, cat, share_reserve_gib, max_compute_oversubscription)

    def copy(self) -> Inventory:
        # Node specs and device states are immutable, so sharing them is safe; only the dict of
        # device states is per-copy (O(devices) pointer copies, ~0.1 ms at 2,000 GPUs).
        # The packer's indexes: O(kinds x device states + models) pointer copies (inner lists and dicts
        # are shared, and replaced rather than changed).
        index = (
            self._pos,
            self._keys,
            self._node_of,
            self._kind_nodes,
            {k: dict(g) for k, g in self._groups.items()},
            dict(self._model_devs),
            dict(self._model_allocs),
        )
        new = Inventory(
            self._nodes,
            dict(self._devices),
            self._catalog,
            self._reserve,
            self._oversub,
            dict(self._owner_models),
            _index=index,
            _host=(dict(self._host_used), self._host_totals, self._host_on, dict(self._host_held)),
        )
        new._kind_lists = self._kind_lists
        return new

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Inventory):
            return NotImplemented
        return (
            self._nodes == other._nodes
            and self._reserve == other._reserve
            and self._oversub == other._oversub
            and self._devices == other._devices
            and self._host_held == other._host_held
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"Inventory({len(self._nodes)} nodes, {self.gpus_total} GPUs, "
            f"{self.gpus_in_use()} in use, {sum(1 for _ in self.allocations())} allocations)"
        )

    # -- read-only views ----------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def share_reserve_gib(self) -> float:
        return self._reserve

    @property
    def max_compute_oversubscription(self) -> float:
        return self._oversub

    @property
    def nodes(self) -> Mapping[str, NodeSpec]:
        return self._nodes

    @property
    def devices(self) -> Mapping[tuple[str, int], DeviceState]:
        return MappingProxyType(self._devices)

    def device(self, node: str, index: int) -> DeviceState:
        try:
            return self._devices[(node, index)]
        except KeyError:
            raise KeyError(f"no GPU {index} on node {node!r}") from None

    def gpu_of(self, node: str) -> GpuModel:
        return self._catalog.get(self._nodes[node].gpu_model)

    @property
    def gpus_total(self) -> int:
        return len(self._devices)

    def gpus_in_use(self) -> int:
        """Devices with at least one allocation (an empty pinned MIG instance does not count)."""
        return sum(1 for d in self._devices.values() if d.entries)

    def allocations(self) -> Iterator[tuple[str, Slot]]:
        """Every (owner, slot), once each (a multi-GPU slot is reported from its first device)."""
        for (_, idx), d in self._devices.items():
            for owner, s in d.entries:
                if s.devices[0] == idx:
                    yield owner, s

    def slots_of(self, owner: str) -> list[Slot]:
        return [s for o, s in self.allocations() if o == owner]

    def model_of(self, owner: str) -> str:
        """The model an allocation serves: the one given to :meth:`allocate`, else read from the
        owner name (``"<model>-<n>"`` or ``"<model>/<i>"``), else the owner name itself."""
        hit = self._owner_models.get(owner)
        return hit[0] if hit is not None else model_from_owner(owner)

    def allocations_by_model(self) -> dict[str, list[tuple[str, Slot]]]:
        """Every (owner, slot) grouped by :meth:`model_of` (what anti-affinity and re-layout read)."""
        out: dict[str, list[tuple[str, Slot]]] = {}
        for owner, s in self.allocations():
            out.setdefault(self.model_of(owner), []).append((owner, s))
        return out

    # -- indexes (what the packer reads instead of scanning every device) -------------------------
    def position(self, node: str, index: int) -> int:
        """The device's position in inventory order (nodes in order, then GPU index)."""
        return self._pos[(node, index)]

    def device_at(self, position: int) -> DeviceState:
        return self._devices[self._keys[position]]

    def node_at(self, position: int) -> str:
        """The name of the device's node at ``position``."""
        return self._keys[position][0]

    def free_gpu_capacity(self, node: str) -> float:
        """GPU capacity still free on ``node``: each device's free memory over its memory (an idle GPU counts 1).
        Cached per node until one of its devices changes."""
        hit = self._node_free.get(node)
        if hit is None:
            total = 0.0
            for i in range(self._nodes[node].gpu_count):
                d = self._devices[(node, i)]
                total += 1.0 if not d.entries and not d.pinned else self._free_memory(d) / d.memory_gib
            hit = self._node_free[node] = total
        return hit

    def idle_gpus(self, node: str) -> int:
        """GPUs of ``node`` with no allocation and no MIG instance (what whole slots take). Cached like
        :meth:`free_gpu_capacity`."""
        hit = self._node_idle.get(node)
        if hit is None:
            hit = self._node_idle[node] = sum(1 for i in range(self._nodes[node].gpu_count)
                                              if self._devices[(node, i)].idle)
        return hit

    def kind_nodes(self, gpu_model: str) -> tuple[str, ...]:
        """The nodes with GPUs of ``gpu_model`` (canonical name), in inventory order."""
        if self._kind_lists is None:
            lists: dict[str, list[str]] = {}
            for n in self._nodes.values():
                if n.gpu_count:
                    lists.setdefault(n.gpu_model, []).append(n.name)
            self._kind_lists = {k: tuple(v) for k, v in lists.items()}
        return self._kind_lists.get(gpu_model, ())

    def kind_gpu_counts(self) -> tuple[tuple[str, int], ...]:
        """(GPU kind, GPUs of that kind) for every kind with GPUs, sorted by kind (static, computed once)."""
        if self._kind_gpus is None:
            self._kind_gpus = tuple(sorted((k, sum(self._nodes[n].gpu_count for n in self.kind_nodes(k)))
                                           for k in self._kind_nodes))
        return self._kind_gpus

    def node_ordinal(self, position: int) -> int:
        """The position of the device's node in :attr:`nodes` order."""
        return self._node_of[position]

    def kind_node_counts(self) -> Mapping[str, int]:
        """GPU kind -> number of nodes with GPUs of that kind."""
        return self._kind_nodes

    def device_groups(self, gpu_model: str) -> Mapping[DeviceSignature, Sequence[int]]:
        """The devices of one GPU kind grouped by :attr:`DeviceState.signature`: signature -> sorted
        positions (see :meth:`position`). Every group is non-empty. Read-only."""
        g = self._groups.get(gpu_model)
        return MappingProxyType(g) if g is not None else MappingProxyType({})

    def model_device_counts(self, model: str) -> Mapping[tuple[str, int], int]:
        """``(node, index)`` -> number of allocations of ``model`` (by :meth:`model_of`) on that device;
        a multi-GPU slot counts on each of its devices. Read-only."""
        return MappingProxyType(self._model_devs.get(model, _NO_COUNTS))

    def model_allocation_count(self, model: str) -> int:
        """Allocations (slots) held by owners of ``model``."""
        return self._model_allocs.get(model, 0)

    def allocated_gpu_fraction(self) -> float:
        """Sum of allocated slots' ``gpu_fraction`` over ``gpus_total`` (0 for an empty cluster)."""
        if not self._devices:
            return 0.0
        return sum(s.gpu_fraction for _, s in self.allocations()) / len(self._devices)

    # -- host CPU and memory (per node, hard where the node declares them) --------------------------
    @property
    def host_accounted(self) -> bool:
        """Some node declares host CPU or memory (else no slot is ever refused for them)."""
        return self._host_on

    def host_used(self, node: str) -> tuple[int, float]:
        """(CPU millis, memory GiB) held on ``node``: by its slots and by pods without one (:meth:`hold_host`)."""
        return self._host_used.get(node, (0, 0.0))

    def host_free(self, node: str) -> tuple[float, float]:
        """(CPU millis, memory GiB) still free on ``node``; ``inf`` for what it does not declare."""
        spec = self._nodes[node]
        c, m = self._host_used.get(node, (0, 0.0))
        return (math.inf if spec.cpu_millis is None else spec.cpu_millis - c,
                math.inf if spec.host_memory_gib is None else spec.host_memory_gib - m)

    def host_held(self, node: str) -> tuple[int, float]:
        """(CPU millis, memory GiB) held on ``node`` by pods without a GPU slot (:meth:`hold_host`)."""
        return self._host_held.get(node, (0, 0.0))

    def host_totals(self) -> tuple[int, float, float]:
        """Over every allocation: (CPU millis, host memory GiB, GPUs by ``gpu_fraction``) -- the GPU workload held
        (what :meth:`hold_host` holds is not in it: it asks for no GPU)."""
        return self._host_totals

    def kind_host_table(self, gpu_model: str) -> KindHostTable:
        """The host state of every node of ``gpu_model`` (canonical name) as arrays, in :meth:`kind_nodes` order:
        what a packer scoring every node for one request reads in a few array operations instead of a loop. Kept
        incrementally: a call re-reads only the nodes changed since the previous one (numpy is imported here, on
        first use, so importing :mod:`sharing` stays dependency-free)."""
        table = self._tables.get(gpu_model)
        if table is None:
            table = self._tables[gpu_model] = KindHostTable.read(self, self.kind_nodes(gpu_model))
            self._stale_rows[gpu_model] = set()
            return table
        stale = self._stale_rows[gpu_model]
        if stale:
            for node in stale:
                table.reread(self, node)
            stale.clear()
        return table

    def _touch(self, node: str) -> None:
        kind = self._nodes[node].gpu_model
        stale = self._stale_rows.get(kind)
        if stale is not None:
            stale.add(node)

    def host_fits(self, node: str, cpu_millis: int, host_memory_gib: float) -> bool:
        """Whether ``node`` has room for these host requests now (always, for what it does not declare)."""
        return self._host_reason(node, cpu_millis, host_memory_gib) is None

    def _host_reason(self, node: str, cpu_millis: int, host_memory_gib: float) -> str | None:
        if cpu_millis <= 0 and host_memory_gib <= 0:
            return None
        spec = self._nodes[node]
        c, m = self._host_used.get(node, (0, 0.0))
        if spec.cpu_millis is not None and c + cpu_millis > spec.cpu_millis:
            return f"CPU over-commit on node {node!r}: {c}m held + {cpu_millis}m asked > {spec.cpu_millis}m"
        if spec.host_memory_gib is not None and m + host_memory_gib > spec.host_memory_gib + _EPS:
            return (f"host memory over-commit on node {node!r}: {m:g} held + {host_memory_gib:g} asked > "
                    f"{spec.host_memory_gib:g} GiB")
        return None

    def hold_host(self, node: str, cpu_millis: int, host_memory_gib: float) -> None:
        """Account host CPU/memory that a pod without a GPU slot holds on ``node`` (a CPU-only pod, another
        workload's pod): the slots get what is left. Refused (AllocationError, nothing changed) past the node's
        capacity, like a slot."""
        if node not in self._nodes:
            raise AllocationError(f"unknown node {node!r}")
        _check_host(cpu_millis, host_memory_gib, f"host held on {node!r}")
        reason = self._host_reason(node, cpu_millis, host_memory_gib)
        if reason is not None:
            raise AllocationError(reason)
        self._host_change(node, cpu_millis, host_memory_gib, 0.0, self._host_held)

    def unhold_host(self, node: str, cpu_millis: int, host_memory_gib: float) -> None:
        """Give back what :meth:`hold_host` held (ValueError, nothing changed, when more than is held)."""
        c, m = self._host_held.get(node, (0, 0.0))
        if cpu_millis > c or host_memory_gib > m + _EPS:
            raise ValueError(f"node {node!r} holds {c}m CPU and {m:g} GiB for pods without slots, not "
                             f"{cpu_millis}m and {host_memory_gib:g} GiB")
        self._host_change(node, -cpu_millis, -host_memory_gib, 0.0, self._host_held)

    def _host_add(self, slot: Slot, sign: int) -> None:
        self._host_change(slot.node, sign * slot.cpu_millis, sign * slot.host_memory_gib, sign * slot.gpu_fraction)

    def _host_change(self, node: str, cpu: int, mem: float, gpus: float,
                     also: dict[str, tuple[int, float]] | None = None) -> None:
        if self._tables:
            self._touch(node)
        for per_node in (self._host_used,) if also is None else (self._host_used, also):
            if cpu or mem:
                c, m = per_node.get(node, (0, 0.0))
                c, m = c + cpu, m + mem
                if c or abs(m) > _EPS:
                    per_node[node] = (c, m)
                else:
                    per_node.pop(node, None)
        if also is None:  # the totals are the slots' (what GPU pods ask per GPU), not what pods without GPUs hold
            tc, tm, tg = self._host_totals
            self._host_totals = (tc + cpu, tm + mem, tg + gpus)

    def mig_layout(self, node: str, device: int) -> tuple[tuple[str, int], ...]:
        """Current MIG instances on a device as ``(profile key, start)``, by start."""
        return self.device(node, device).instances()

    # -- memory accounting ----------------------------------------------------------------
    def share_room_gib(self, d: DeviceState, inst: tuple[str, int] | None = None) -> float:
        """Memory a new share could still get in a plain GPU (None) or a MIG instance."""
        cap = d.memory_gib if inst is None else d.gpu.profiles[inst[0]].memory_gib
        u = d.usage.get(inst)
        if u is None:
            return max(0.0, cap - self._reserve)
        if u.exclusive:
            return 0.0
        return max(0.0, cap - u.share_memory_gib - self._reserve)

    def device_free_memory_gib(self, node: str, index: int) -> float:
        """Memory a device could still give out.

        Non-MIG: device memory, less the shares and (once shared) the reserve; 0 under a whole slot.
        MIG: uncovered memory slices (device memory split evenly), plus empty instances, plus the
        room left in shared instances.
        """
        return self._free_memory(self.device(node, index))

    def free_memory_of(self, d: DeviceState) -> float:
        """:meth:`device_free_memory_gib` for a state at hand (the packer's scans)."""
        return self._free_memory(d)

    def _free_memory(self, d: DeviceState) -> float:
        if not d.entries and not d.pinned:
            return d.memory_gib
        if d.whole_owner is not None:
            return 0.0
        if not d.mig_enabled:
            return self.share_room_gib(d, None)
        gpu = d.gpu
        free = (gpu.mem_slices_total - d.occupied_mask.bit_count()) * gpu.mem_slice_gib
        for inst in d.instances():
            # An empty instance offers all of its memory; a shared one what the reserve leaves.
            free += gpu.profiles[inst[0]].memory_gib if inst not in d.usage else self.share_room_gib(d, inst)
        return free

    def free_memory_gib(self) -> float:
        return sum(self._free_memory(d) for d in self._devices.values())

    def largest_free_gib(self, node: str, index: int) -> float:
        """The largest memory one new slot could get on this device now."""
        return self._largest_free(self.device(node, index))

    def _largest_free(self, d: DeviceState) -> float:
        if not d.entries and not d.pinned:
            return d.memory_gib
        if d.whole_owner is not None:
            return 0.0
        if not d.mig_enabled:
            return self.share_room_gib(d, None)
        gpu = d.gpu
        best = 0.0
        for inst in d.instances():
            best = max(
                best,
                gpu.profiles[inst[0]].memory_gib if inst not in d.usage else self.share_room_gib(d, inst),
            )
        for p in reversed(gpu.profiles_by_size()):
            if p.memory_gib <= best:
                break
            if any(d.can_create(p, st) for st in p.placements):
                best = p.memory_gib
                break
        return best

    def fragmentation(self, reference_gib: float | None = None) -> float:
        """Share of free GPU memory that is stranded, in [0, 1].

        Stranded = free memory on *partially used* devices (holding an allocation or a MIG
        instance) whose largest obtainable slot is smaller than the reference request:
        ``reference_gib`` GiB, or by default a whole GPU (so all free memory on partially used
        devices counts). Free memory on untouched devices is never stranded. 0 when nothing is
        free. A simple, cheap stand-in; the FGD definition (expected fragment over a workload
        mix) belongs to a later packer.
        """
        total = stranded = 0.0
        for d in self._devices.values():
            free = self._free_memory(d)
            total += free
            if free <= 0 or d.idle:
                continue
            if reference_gib is None or self._largest_free(d) < reference_gib - _EPS:
                stranded += free
        return stranded / total if total > 0 else 0.0

    # -- legality ---------------------------------------------------------------------------
    def _new_instance_reason(self, d: DeviceState, gpu: GpuModel, p: MigProfile, start: int) -> str | None:
        """Why instance (p, start) could not be created on d now, or None if it could."""
        if d.can_create(p, start):
            return None
        if start not in p.placements:
            return f"start {start} is not a legal placement of {p.name} on {gpu.name} (legal: {p.placements})"
        if start + p.mem_slices > gpu.mem_slices_total:
            return f"{p.name}@{start} runs past the {gpu.mem_slices_total} memory slices"
        if d.occupied_mask & _mask(start, p.mem_slices):
            return f"{p.name}@{start} overlaps existing MIG instances {list(d.instances())}"
        if d.profile_count(p.key) >= p.max_count:
            return f"{gpu.name} allows at most {p.max_count} {p.name} instance(s)"
        return f"{p.name}@{start} would exceed {gpu.compute_slices_total} compute slices"

    def why_not(self, slot: Slot) -> str | None:
        """Why ``slot`` cannot be allocated now, or None if it can: the GPU's rules, then the node's host CPU and
        memory (:meth:`host_fits`)."""
        reason = self._gpu_reason(slot)
        if reason is None and slot.asks_host:
            return self._host_reason(slot.node, slot.cpu_millis, slot.host_memory_gib)
        return reason

    def _gpu_reason(self, slot: Slot) -> str | None:
        node = self._nodes.get(slot.node)
        if node is None:
            return f"unknown node {slot.node!r}"
        if slot.gpu_model != node.gpu_model:  # slots normally carry the canonical name: skip lookup
            if slot.gpu_model not in self._catalog:
                return f"unknown GPU kind {slot.gpu_model!r}"
            if self._catalog.resolve(slot.gpu_model) != node.gpu_model:
                return f"node {node.name!r} has {node.gpu_model} GPUs, not {slot.gpu_model}"
        for i in slot.devices:
            if not 0 <= i < node.gpu_count:
                return f"node {node.name!r} has no GPU {i} (it has {node.gpu_count})"
        if len(slot.devices) > 1 and len(set(slot.devices)) != len(slot.devices):
            return f"repeated device in {slot.devices}"
        d = self._devices[(slot.node, slot.devices[0])]
        gpu = d.gpu
        if slot.kind is SlotKind.WHOLE:
            return self._whole_reason(slot, gpu, [self._devices[(slot.node, i)] for i in slot.devices])
        if d.whole_owner is not None:
            return f"GPU {d.index} is held whole by {d.whole_owner!r}"
        if slot.instance is None:  # a time-slice share of a plain GPU
            if d.mig_enabled:
                return f"GPU {d.index} is in MIG mode: a share must sit inside a MIG instance"
            return self._share_reason(d, slot, d.memory_gib, 1.0, None)
        if not d.mig_enabled:
            return f"GPU {d.index} on {node.name!r} is not in MIG mode"
        assert slot.profile is not None and slot.start is not None
        p = gpu.profiles.get(slot.profile)
        if p is None:
            return f"{gpu.name} has no MIG profile {slot.profile!r}"
        inst = (p.key, slot.start)
        if inst not in d.instances():  # existing instances are legal; a new one is checked in full
            reason = self._new_instance_reason(d, gpu, p, slot.start)
            if reason is not None:
                return reason
        u = d.usage.get(inst)
        if slot.kind is SlotKind.MIG:
            if not math.isclose(slot.memory_gib, p.memory_gib, abs_tol=_EPS):
                return f"a {p.name} slot gives {p.memory_gib} GiB, not {slot.memory_gib}"
            if not math.isclose(slot.compute_fraction, gpu.compute_fraction(p), abs_tol=_EPS):
                return f"a {p.name} slot has compute {gpu.compute_fraction(p):.4f}, not {slot.compute_fraction}"
            if u is not None:
                return f"MIG instance {p.name}@{slot.start} is already used by {d.occupants(inst)[0][0]!r}"
            return None
        if u is not None and u.exclusive:
            return f"MIG instance {p.name}@{slot.start} is held exclusively by {d.occupants(inst)[0][0]!r}"
        return self._share_reason(d, slot, p.memory_gib, gpu.compute_fraction(p), inst)

    def _whole_reason(self, slot: Slot, gpu: GpuModel, states: list[DeviceState]) -> str | None:
        n = len(slot.devices)
        if not math.isclose(slot.memory_gib, gpu.memory_gib * n, abs_tol=_EPS):
            return f"a whole slot of {n} {gpu.name} gives {gpu.memory_gib * n} GiB, not {slot.memory_gib}"
        if not math.isclose(slot.compute_fraction, float(n), abs_tol=_EPS):
            return f"a whole slot of {n} GPU(s) has compute {n}, not {slot.compute_fraction}"
        for d in states:
            if d.entries:
                return f"GPU {d.index} on {d.node!r} is not free (used by {d.entries[0][0]!r})"
            if d.pinned:
                return f"GPU {d.index} on {d.node!r} has MIG instances {list(d.pinned)}"
        return None

    def _share_reason(
        self,
        d: DeviceState,
        slot: Slot,
        capacity_gib: float,
        compute_cap: float,
        inst: tuple[str, int] | None,
    ) -> str | None:
        u = d.usage.get(inst)
        used_mem, used_comp = (u.share_memory_gib, u.share_compute) if u is not None else (0.0, 0.0)
        where = f"GPU {d.index} on {d.node!r}" + (f" instance {inst[0]}@{inst[1]}" if inst else "")
        if used_mem + slot.memory_gib + self._reserve > capacity_gib + _EPS:
            return (
                f"memory over-commit on {where}: {used_mem:g} used + {slot.memory_gib:g} asked + "
                f"{self._reserve:g} reserve > {capacity_gib:g} GiB"
            )
        limit = compute_cap * self._oversub
        if used_comp + slot.compute_fraction > limit + _EPS:
            total = used_comp + slot.compute_fraction
            return f"compute oversubscription on {where}: {total:.3g} > {limit:.3g}"
        return None

    def fits(self, slot: Slot) -> bool:
        return self.why_not(slot) is None

    # -- mutation -----------------------------------------------------------------------------
    def _put(self, d: DeviceState, **changes: object) -> None:
        key = (d.node, d.index)
        new = replace(d, **changes)  # type: ignore[arg-type]
        self._devices[key] = new
        self._node_free.pop(d.node, None)
        self._node_idle.pop(d.node, None)
        if self._tables:
            self._touch(d.node)
        old_sig, new_sig = d.signature, new.signature
        if old_sig != new_sig:
            groups = self._groups[d.gpu_model]
            p = self._pos[key]
            members = groups[old_sig]
            if len(members) == 1:
                del groups[old_sig]
            else:
                members = members.copy()  # shared with copies of this inventory: replace, never change
                del members[bisect_left(members, p)]
                groups[old_sig] = members
            members = groups.get(new_sig)
            if members is None:
                groups[new_sig] = [p]
            else:
                members = members.copy()
                insort(members, p)
                groups[new_sig] = members

    def _count_model(self, model: str, keys: Sequence[tuple[str, int]], delta: int, allocs: int) -> None:
        per = dict(self._model_devs.get(model, _NO_COUNTS))  # shared with copies: replace, never change
        for k in keys:
            n = per.get(k, 0) + delta
            if n:
                per[k] = n
            else:
                del per[k]
        if per:
            self._model_devs[model] = per
        else:
            self._model_devs.pop(model, None)
        n = self._model_allocs.get(model, 0) + allocs
        if n:
            self._model_allocs[model] = n
        else:
            self._model_allocs.pop(model, None)

    def _move_owner(self, owner: str, before: str, after: str, skip: Slot | None) -> None:
        """The owner's model changed from ``before`` to ``after``: recount its other entries."""
        moved: list[tuple[str, int]] = []
        allocs = 0
        for k in list(self._model_devs.get(before, _NO_COUNTS)):
            for o, s in self._devices[k].entries:
                if o == owner and s != skip:
                    moved.append(k)
                    allocs += s.devices[0] == k[1]
        if moved:
            self._count_model(before, moved, -1, -allocs)
            self._count_model(after, moved, 1, allocs)

    def allocate(self, slot: Slot, owner: str, model: str | None = None) -> None:
        """Give ``slot`` to ``owner``; raises :class:`AllocationError` (a ValueError) if illegal.

        ``model`` (optional) records which model the owner serves, for :meth:`model_of`; without
        it the model is read from the owner name.
        """
        if not owner:
            raise AllocationError("owner must be a non-empty string")
        known = self._owner_models.get(owner)
        if model is not None and known is not None and known[0] != model:
            raise AllocationError(f"owner {owner!r} already serves model {known[0]!r}, not {model!r}")
        reason = self.why_not(slot)
        if reason is None and (owner, slot) in self._devices[(slot.node, slot.devices[0])].entries:
            reason = "already allocated to this owner"
        if reason is not None:
            raise AllocationError(f"cannot allocate {slot.describe()} to {owner!r}: {reason}")
        for i in slot.devices:
            d = self._devices[(slot.node, i)]
            self._put(d, entries=tuple(sorted((*d.entries, (owner, slot)), key=_entry_key)))
        if model is not None or known is not None:
            name = model if model is not None else known[0]  # type: ignore[index]
            self._owner_models[owner] = (name, (known[1] if known is not None else 0) + 1)
        after = self.model_of(owner)
        if known is None and model is not None:  # the owner's model may change from the one its name says
            before = model_from_owner(owner)
            if after != before:
                self._move_owner(owner, before, after, slot)
        self._count_model(after, [(slot.node, i) for i in slot.devices], 1, 1)
        self._host_add(slot, 1)

    def release(self, slot: Slot, owner: str) -> None:
        """Take ``slot`` back from ``owner``; raises KeyError if it is not allocated to them.

        A MIG instance created for the slot disappears with it unless it was pinned.
        """
        keys = [(slot.node, i) for i in slot.devices]
        if not all(k in self._devices and (owner, slot) in self._devices[k].entries for k in keys):
            raise KeyError(f"{slot.describe()} is not allocated to {owner!r}")
        before = self.model_of(owner)
        for k in keys:
            d = self._devices[k]
            entries = list(d.entries)
            entries.remove((owner, slot))
            self._put(d, entries=tuple(entries))
        self._count_model(before, keys, -1, -1)
        self._host_add(slot, -1)
        known = self._owner_models.get(owner)
        if known is not None:
            if known[1] <= 1:
                del self._owner_models[owner]
                after = model_from_owner(owner)  # the owner's model may change back to the one its name says
                if after != before:
                    self._move_owner(owner, before, after, None)
            else:
                self._owner_models[owner] = (known[0], known[1] - 1)

    def create_mig_instance(self, node: str, device: int, profile: str, start: int) -> None:
        """Pin an instance that exists without an occupant (a layout applied ahead of demand, or
        observed on a live node). Pinned instances survive release; destroy them explicitly."""
        d = self.device(node, device)
        gpu = d.gpu
        if not d.mig_enabled:
            raise AllocationError(f"GPU {device} on {node!r} is not in MIG mode")
        if d.whole_owner is not None:
            raise AllocationError(f"GPU {device} on {node!r} is held whole by {d.whole_owner!r}")
        try:
            p = gpu.profile(profile)
        except KeyError as e:
            raise AllocationError(str(e)) from None
        inst = (p.key, start)
        if inst in d.pinned:
            raise AllocationError(f"{p.name}@{start} already exists on GPU {device} of {node!r}")
        if inst not in d.instances():  # an occupied on-demand instance just becomes pinned
            reason = self._new_instance_reason(d, gpu, p, start)
            if reason is not None:
                raise AllocationError(reason)
        self._put(d, pinned=tuple(sorted((*d.pinned, inst))))

    def destroy_mig_instance(self, node: str, device: int, profile: str, start: int) -> None:
        d = self.device(node, device)
        p = d.gpu.profile(profile)
        inst = (p.key, start)
        if inst not in d.pinned:
            raise KeyError(f"no pinned MIG instance {p.name}@{start} on GPU {device} of {node!r}")
        if d.occupants(inst):
            raise AllocationError(f"MIG instance {p.name}@{start} is in use by {d.occupants(inst)[0][0]!r}")
        self._put(d, pinned=tuple(x for x in d.pinned if x != inst))

    def set_mig_mode(self, node: str, device: int, enabled: bool) -> None:
        """Switch a GPU's MIG mode; only an idle GPU (no allocation, no instance) may switch."""
        d = self.device(node, device)
        if enabled and not d.gpu.mig_capable:
            raise AllocationError(f"{d.gpu_model} does not support MIG")
        if not d.idle and d.mig_enabled != enabled:
            raise AllocationError(f"GPU {device} on {node!r} is not idle; drain it before switching MIG mode")
        self._put(d, mig_enabled=enabled)


FREE_MILLI = 1000  # fragmentation's unit (sharing/fragmentation.py): 1/1000 of a GPU


def free_milli(inv: Inventory, d: DeviceState) -> int:
    """A device's free GPU capacity in milli, as fragmentation counts it: an idle GPU 1000, a time-slice GPU its free
    memory share (floored), anything else (held whole, MIG-enabled) 0 -- MIG layouts have their own measure
    (``future_slots``)."""
    if d.idle:
        return FREE_MILLI
    if d.whole_owner is not None or d.mig_enabled:
        return 0
    return max(0, math.floor(inv.free_memory_of(d) / d.memory_gib * FREE_MILLI + 1e-9))


def milli_after(inv: Inventory, d: DeviceState, memory_gib: float) -> int:
    """:func:`free_milli` of a time-slice device after a share of ``memory_gib`` lands on it."""
    if d.mig_enabled:
        return 0
    free = (inv.share_room_gib(d, None) if not d.idle else d.memory_gib) - memory_gib
    return max(0, math.floor(free / d.memory_gib * FREE_MILLI + 1e-9))


class KindHostTable:
    """One GPU kind's nodes as arrays (:meth:`Inventory.kind_host_table`), row ``i`` = ``nodes[i]``: idle GPUs, free
    GPU capacity (:meth:`Inventory.free_gpu_capacity`), host CPU (millis) and memory (GiB) held and declared (``inf``:
    not declared), and whether the node declares either. The same numbers as the Inventory's own per-node answers."""

    __slots__ = ("cpu_cap", "cpu_used", "dev_free", "free", "host_accounted", "idle", "mem_cap", "mem_used", "nodes",
                 "ordinal", "pos_rows", "row", "version")

    def __init__(self, nodes: tuple[str, ...], width: int = 0) -> None:
        import numpy as np

        n = len(nodes)
        self.nodes = nodes
        # Per device, its free capacity in milli as fragmentation counts it (:func:`sharing.fragmentation.free_milli`;
        # 0 past the node's GPU count), and per row a counter bumped on every re-read (what a cache over the table,
        # such as :class:`~sharing.fragmentation.KindFragmentation`, compares to re-read only the rows that changed).
        self.dev_free = np.zeros((n, width), dtype=np.int64)
        self.version = np.zeros(n, dtype=np.int64)
        self.ordinal = np.zeros(n, dtype=np.int64)  # the node's place in the inventory's node order (static)
        self.row = {name: i for i, name in enumerate(nodes)}
        self.idle = np.zeros(n, dtype=np.int64)
        self.free = np.zeros(n)
        self.cpu_used = np.zeros(n)
        self.mem_used = np.zeros(n)
        self.cpu_cap = np.full(n, np.inf)
        self.mem_cap = np.full(n, np.inf)
        self.host_accounted = np.zeros(n, dtype=bool)
        self.pos_rows = np.zeros(0, dtype=np.int64)  # device position -> its node's row (-1: another kind's)

    @classmethod
    def read(cls, inv: Inventory, nodes: tuple[str, ...]) -> KindHostTable:
        table = cls(nodes, max((inv.nodes[name].gpu_count for name in nodes), default=0))
        for name in nodes:
            spec = inv.nodes[name]
            i = table.row[name]
            if spec.cpu_millis is not None:
                table.cpu_cap[i] = spec.cpu_millis
            if spec.host_memory_gib is not None:
                table.mem_cap[i] = spec.host_memory_gib
            table.host_accounted[i] = spec.host_accounted
            table.reread(inv, name)
        import numpy as np

        order = {name: i for i, name in enumerate(inv.nodes)}
        table.ordinal[:] = [order[name] for name in nodes]
        table.pos_rows = np.full(len(inv.devices), -1, dtype=np.int64)
        for name in nodes:
            for k in range(inv.nodes[name].gpu_count):
                table.pos_rows[inv.position(name, k)] = table.row[name]
        return table

    def reread(self, inv: Inventory, node: str) -> None:
        i = self.row[node]
        self.idle[i] = inv.idle_gpus(node)
        self.free[i] = inv.free_gpu_capacity(node)
        c, m = inv.host_used(node)
        self.cpu_used[i] = c
        self.mem_used[i] = m
        for k in range(inv.nodes[node].gpu_count):
            self.dev_free[i, k] = free_milli(inv, inv.device(node, k))
        self.version[i] += 1

    def host_fits(self, cpu_millis: int, host_memory_gib: float) -> object:
        """Bool per node: room for these host requests (:meth:`Inventory.host_fits`, the same comparisons)."""
        import numpy as np

        if cpu_millis <= 0 and host_memory_gib <= 0:
            return np.ones(len(self.nodes), dtype=bool)
        return ~((self.cpu_used + cpu_millis > self.cpu_cap) | (self.mem_used + host_memory_gib > self.mem_cap + _EPS))

