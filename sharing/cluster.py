"""Cluster specs: a compact text form and a YAML-dict form, both giving a list of NodeSpec.

Text grammar (whitespace around tokens ignored)::

    spec   := item ("," item)*
    item   := [count ("x" | "*")] kind (":" option)*
    count  := positive integer: GPUs of this kind in total (default 1)
    kind   := any name the catalog accepts (H100-80GB, H100, A30, T4, V100M32, ...)
    option := "mig"          MIG mode on (the kind must support MIG)
            | "gpn=" N       GPUs per node (default 8); the last node takes the remainder
            | "cpu=" C       host CPU cores per node available to slots (default: not accounted)
            | "mem=" G       host memory GiB per node available to slots (default: not accounted)

    "4xH100-80GB:mig,8xA100-40GB,2xL4"  ->  1 node of 4 H100 in MIG mode, 1 node of 8 A100-40GB,
                                             1 node of 2 L4
    "20xT4:gpn=4"                        ->  5 nodes of 4 T4
    "16xH100:cpu=96:mem=1024"            ->  2 nodes of 8 H100, each 96 CPU cores and 1 TiB of host memory

Dict form (what a YAML file parses to; this module imports no YAML library)::

    [{kind: H100-80GB, nodes: 2, gpus_per_node: 8, mig: true}, {kind: T4, gpus: 12}]

Each entry: ``kind`` (required); either ``nodes`` (default 1) with ``gpus_per_node`` (default 8),
or ``gpus`` (total, split into nodes of up to ``gpus_per_node``); ``mig`` (default false);
optional ``name`` (node-name prefix), ``labels``, and ``cpu`` (cores) / ``memory_gib`` per node: the host
capacity slots may use (:class:`~sharing.slots.NodeSpec`; absent = not accounted, as before). A mapping with a
``nodes`` or ``cluster`` list is accepted too.

Node names are ``<prefix>-<i>``, prefix = the kind's canonical name in lower case, numbered on
across items of the same prefix. Nodes carry GFD-style labels (``nvidia.com/gpu.product`` etc.).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sharing.catalog import Catalog, GpuModel, load_catalog
from sharing.render import GPU_PRODUCT
from sharing.slots import NodeSpec

_DEFAULT_GPN = 8
_ITEM = re.compile(r"^(?:(?P<count>\d+)\s*[xX*]\s*)?(?P<kind>[^:]+?)\s*(?P<opts>(?::[^:]*)*)$")
_ENTRY_KEYS = frozenset({"kind", "nodes", "gpus_per_node", "gpus", "mig", "name", "labels", "cpu", "memory_gib"})


class ClusterSpecError(ValueError):
    """A cluster spec that does not parse; the message names the bad token or entry."""


def _labels(gpu: GpuModel, count: int, mig: bool, extra: Mapping[str, str]) -> dict[str, str]:
    labels = {
        GPU_PRODUCT: gpu.name,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(int(gpu.memory_gib * 1024)),  # GFD publishes MiB
        "nvidia.com/mig.capable": str(gpu.mig_capable).lower(),
    }
    if mig:
        labels["nvidia.com/mig.strategy"] = "mixed"
    labels.update({str(k): str(v) for k, v in extra.items()})
    return labels


class _Builder:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.nodes: list[NodeSpec] = []
        self.counters: dict[str, int] = {}

    def add(
        self,
        where: str,
        kind: str,
        sizes: Sequence[int],
        mig: bool,
        prefix: str | None = None,
        labels: Mapping[str, str] | None = None,
        host: tuple[int | None, float | None] = (None, None),
    ) -> None:
        try:
            gpu = self.catalog.get(kind)
        except KeyError as e:
            raise ClusterSpecError(f"{where}: {e.args[0]}") from None
        if mig and not gpu.mig_capable:
            raise ClusterSpecError(f"{where}: {gpu.name} does not support MIG")
        pre = prefix or gpu.name.lower()
        for size in sizes:
            i = self.counters.get(pre, 0)
            self.counters[pre] = i + 1
            self.nodes.append(NodeSpec(f"{pre}-{i}", gpu.name, size, mig, _labels(gpu, size, mig, labels or {}),
                                       cpu_millis=host[0], host_memory_gib=host[1]))


def _host_number(v: Any, what: str, where: str) -> float:
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ClusterSpecError(f"{where}: {what} must be a number >= 0, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (v >= 0 and v != float("inf")):
        raise ClusterSpecError(f"{where}: {what} must be a number >= 0, got {v!r}")
    return float(v)


def _host(cpu: Any, mem: Any, where: str) -> tuple[int | None, float | None]:
    """(cpu millis, memory GiB) from cores and GiB as written (None: not given)."""
    return (None if cpu is None else round(_host_number(cpu, "cpu", where) * 1000),
            None if mem is None else _host_number(mem, "memory_gib", where))


def _split(total: int, per_node: int) -> list[int]:
    full, rest = divmod(total, per_node)
    return [per_node] * full + ([rest] if rest else [])


def _parse_text(text: str, b: _Builder) -> None:
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise ClusterSpecError("empty cluster spec")
    for tok in items:
        if not tok:
            raise ClusterSpecError(f"empty item in cluster spec {text!r}")
        m = _ITEM.match(tok)
        if m is None:
            raise ClusterSpecError(f"cannot parse cluster spec item {tok!r} (expected e.g. '4xH100-80GB:mig')")
        count = int(m["count"]) if m["count"] else 1
        if count < 1:
            raise ClusterSpecError(f"{tok!r}: GPU count must be >= 1")
        mig, gpn = False, _DEFAULT_GPN
        cpu: str | None = None
        mem: str | None = None
        for opt in (o.strip().lower() for o in m["opts"].split(":")[1:]):
            if opt == "mig":
                mig = True
            elif opt.startswith("cpu="):
                cpu = opt[4:]
            elif opt.startswith("mem="):
                mem = opt[4:]
            elif opt.startswith("gpn="):
                try:
                    gpn = int(opt[4:])
                except ValueError:
                    raise ClusterSpecError(f"{tok!r}: bad option {opt!r} (gpn=N, N >= 1)") from None
                if gpn < 1:
                    raise ClusterSpecError(f"{tok!r}: bad option {opt!r} (gpn=N, N >= 1)")
            else:
                raise ClusterSpecError(f"{tok!r}: unknown option {opt!r} (options: mig, gpn=N, cpu=C, mem=G)")
        b.add(repr(tok), m["kind"].strip(), _split(count, gpn), mig, host=_host(cpu, mem, repr(tok)))


def _int(entry: Mapping[str, Any], key: str, default: int, where: str) -> int:
    v = entry.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ClusterSpecError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v


def _parse_entries(entries: Sequence[Any], b: _Builder) -> None:
    if not entries:
        raise ClusterSpecError("empty cluster spec")
    for n, entry in enumerate(entries):
        where = f"cluster entry {n}"
        if not isinstance(entry, Mapping):
            raise ClusterSpecError(f"{where}: expected a mapping, got {entry!r}")
        unknown = set(entry) - _ENTRY_KEYS
        if unknown:
            raise ClusterSpecError(
                f"{where}: unknown key(s) {sorted(map(str, unknown))}; allowed {sorted(_ENTRY_KEYS)}"
            )
        kind = entry.get("kind")
        if not isinstance(kind, str) or not kind:
            raise ClusterSpecError(f"{where}: 'kind' is required (a GPU kind name), got {kind!r}")
        where = f"{where} ({kind})"
        gpn = _int(entry, "gpus_per_node", _DEFAULT_GPN, where)
        if "gpus" in entry:
            if "nodes" in entry:
                raise ClusterSpecError(f"{where}: give either 'gpus' or 'nodes', not both")
            sizes = _split(_int(entry, "gpus", 1, where), gpn)
        else:
            sizes = [gpn] * _int(entry, "nodes", 1, where)
        mig = entry.get("mig", False)
        if not isinstance(mig, bool):
            raise ClusterSpecError(f"{where}: mig must be true or false, got {mig!r}")
        labels = entry.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise ClusterSpecError(f"{where}: labels must be a mapping, got {labels!r}")
        prefix = entry.get("name")
        if prefix is not None and (not isinstance(prefix, str) or not prefix):
            raise ClusterSpecError(f"{where}: name must be a non-empty string, got {prefix!r}")
        b.add(where, kind, sizes, mig, prefix, labels, _host(entry.get("cpu"), entry.get("memory_gib"), where))


def nodes_from_spec(
    spec: str | Sequence[Mapping[str, Any]] | Mapping[str, Any], catalog: Catalog | None = None
) -> list[NodeSpec]:
    """Nodes described by a text spec or its dict form (grammar in the module docstring).

    Raises :class:`ClusterSpecError` (a ValueError) naming the bad token or entry.
    """
    b = _Builder(catalog if catalog is not None else load_catalog())
    if isinstance(spec, str):
        _parse_text(spec, b)
    elif isinstance(spec, Mapping):
        inner = spec.get("nodes", spec.get("cluster"))
        if not isinstance(inner, Sequence) or isinstance(inner, str):
            raise ClusterSpecError("a cluster mapping needs a 'nodes' (or 'cluster') list of entries")
        _parse_entries(inner, b)
    elif isinstance(spec, Sequence):
        _parse_entries(spec, b)
    else:
        raise ClusterSpecError(f"cluster spec must be text or a list of mappings, got {type(spec).__name__}")
    return b.nodes
