"""The per-model spec, parsed from ``slotwise.io/*`` annotations in ONE place.

Every other part of slotwise receives a :class:`ModelSpec`; nothing else reads annotations.
An invalid value never raises past this module for other models: :func:`parse_annotations`
raises :class:`SpecError` listing every problem of *that* model, and the caller turns it into an
Event plus a status condition on that model only (see ``docs/annotations.md``).

A value can be valid and still extreme (``concurrency: 1e400`` as a whole number, ``max-replicas: 100000`` of
thousandth-GPU shares): every numeric key also has an operator-set cap, :class:`SpecLimits` (the settings'
``limits:``, with safe defaults), and :func:`limit_problems` names each value over its cap. The decision core
applies them to every model before it decides (``autoscaler/decision/admission.py``), so one Deployment's
annotations cannot make a tick raise, run for minutes, or raise the cluster's time-slicing config past the cap.

The simulator's model files use the same keys without the ``slotwise.io/`` prefix and go through
:func:`parse_mapping`, so there is one parser for both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sharing.catalog import Catalog
from sharing.slot_speed import speed_of
from sharing.slots import Slot, SlotRequest

PREFIX = "slotwise.io/"

SLO_METRICS = ("e2e", "ttft")
SLOT_KINDS = ("whole", "mig", "share")
KEEP_ALIVE_POLICIES = ("learned", "hybrid", "fixed")  # autoscaler/policies/keepalive.py


@dataclass(frozen=True)
class SpecProblem:
    key: str
    value: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.reason}"


class SpecError(ValueError):
    """All problems found in one model's annotations."""

    def __init__(self, model: str, problems: list[SpecProblem]) -> None:
        self.model = model
        self.problems = problems
        super().__init__(f"model {model}: " + "; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class ModelSpec:
    """What the platform user declared for one model (a Deployment).

    Latency is end-to-end (``e2e``) or time to first token (``ttft``); ``slo_percentile`` of requests
    must finish within ``slo_latency_ms``. ``slo_itl_ms`` (optional) is a second target, on the inter-token latency
    (ITL, also called TPOT: the time between output tokens while a request decodes), at the same percentile: a
    request is late when it misses either. With continuous batching a replica's ITL grows with the number of
    requests it decodes at once, ``ITL(b) = decode_ms_per_token * (1 + decode_batch_slowdown * (b - 1))``
    (``autoscaler/estimation/capacity.py``), so an ITL target caps the batch a replica may run.
    ``gpu_memory_gib`` None means the replica takes whole GPUs.
    Service-time fields are priors for the capacity model (and drive the simulator): a request's
    service time is ``service_time_ms`` or, with token counts, ``prefill_ms_per_1k_tokens * in/1000 +
    decode_ms_per_token * out``; ``concurrency`` requests share one replica at a time.
    ``slot_speeds`` says how fast slot kinds run relative to the hardware those service times were
    measured on (``(("L4", 0.4), ("1g.10gb", 0.25))``; how keys match a replica's slot: ``docs/annotations.md``);
    kinds it does not name run at their published speed (:func:`replica_speed`).
    """

    name: str
    namespace: str = "default"
    slo_latency_ms: float = 1000.0
    slo_percentile: float = 95.0
    slo_metric: str = "e2e"
    slo_itl_ms: float | None = None  # inter-token latency target (ms) at slo_percentile; None: no ITL SLO
    min_replicas: int = 1
    max_replicas: int = 100
    gpu_memory_gib: float | None = None
    gpu_compute_share: float = 1.0
    gpus_per_replica: int = 1
    # pods per replica, each with gpus_per_replica GPUs, placed together (all or none): a LeaderWorkerSet's group
    # size. Not an annotation: read from the workload (autoscaler/live/kube/workloads.py); 1 for other kinds.
    pods_per_replica: int = 1
    # host CPU (millicores) and memory (GiB) each pod asks for: not annotations either, read from the workload's pod
    # template (its containers' requests, autoscaler/live/kube/translate.py); 0: none asked (not accounted)
    cpu_millis: int = 0
    host_memory_gib: float = 0.0
    slot_kinds: tuple[str, ...] = SLOT_KINDS
    slot_speeds: tuple[tuple[str, float], ...] = ()  # (slot-kind key or pattern, relative speed > 0)
    team: str = "default"
    priority: int = 0
    cold_start_s: float = 60.0
    service_time_ms: float = 100.0
    prefill_ms_per_1k_tokens: float | None = None
    decode_ms_per_token: float | None = None  # the ITL of a request decoding alone (batch 1)
    decode_batch_slowdown: float = 0.0  # ITL's growth per extra request in the decode batch (0: none)
    concurrency: int = 1
    # KV cache one replica holds, in tokens (vLLM logs it at start: GPU blocks x block size). The simulator's engines
    # admit a replica's requests only as far as their KV fits and report its use, the KV rail's signal
    # (autoscaler/sim/queueing.py); the controller reads the use from the engines, not this. None: not simulated.
    kv_cache_tokens: int | None = None
    expected_rps: float | None = None  # load hint for a new model, until it has history
    # Scale to zero (min_replicas 0 only; autoscaler/decision/zero.py, autoscaler/policies/keepalive.py): which
    # keep-alive policy decides 0 or 1 for an idle model, fixed's keep-alive (also the idle-time histogram's range
    # and the fallback with too few idle times), and, for learned, how many warm replica-seconds one avoided
    # cold-started request is worth.
    keep_alive: str = "learned"
    keep_alive_s: float = 600.0
    cold_start_worth_s: float = 300.0
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def slo_latency_s(self) -> float:
        return self.slo_latency_ms / 1000.0

    @property
    def slo_itl_s(self) -> float | None:
        return None if self.slo_itl_ms is None else self.slo_itl_ms / 1000.0

    @property
    def service_time_s(self) -> float:
        return self.service_time_ms / 1000.0

    def with_(self, **changes: Any) -> ModelSpec:
        return replace(self, **changes)


def _float(v: str, rule: str) -> float:
    try:
        return float(v)
    except ValueError:
        raise ValueError(rule) from None


def _positive_float(v: str) -> float:
    x = _float(v, "must be a positive number")
    if not math.isfinite(x) or x <= 0:
        raise ValueError("must be a positive number")
    return x


def _nonneg_float(v: str) -> float:
    x = _float(v, "must be a number >= 0")
    if not math.isfinite(x) or x < 0:
        raise ValueError("must be a number >= 0")
    return x


def _slowdown(v: str) -> float:
    x = _float(v, "must be a number in [0, 1]")
    if not (math.isfinite(x) and 0 <= x <= 1):
        raise ValueError("must be a number in [0, 1] (the ITL's growth per extra request in the batch, e.g. 0.02)")
    return x


def _percentile(v: str) -> float:
    x = _float(v, "must be strictly between 0 and 100, e.g. 95 or 99.9")
    if not (0 < x < 100):
        raise ValueError("must be strictly between 0 and 100, e.g. 95 or 99.9")
    return x


def _nonneg_int(v: str) -> int:
    try:
        x = int(v)
    except ValueError:
        raise ValueError("must be a whole number >= 0") from None
    if x < 0:
        raise ValueError("must be a whole number >= 0")
    return x


def _positive_int(v: str) -> int:
    x = _nonneg_int(v)
    if x < 1:
        raise ValueError("must be a whole number >= 1")
    return x


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise ValueError("must be a whole number") from None


def _share(v: str) -> float:
    x = _float(v, "must be a fraction of one GPU in (0, 1]")
    if not (0 < x <= 1):
        raise ValueError("must be a fraction of one GPU in (0, 1]")
    return x


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return v

    return parse


def _kinds(v: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in v.split(",") if k.strip())
    bad = [k for k in kinds if k not in SLOT_KINDS]
    if not kinds or bad:
        raise ValueError(f"must be a comma-separated subset of {', '.join(SLOT_KINDS)}")
    return kinds


def _slot_speeds(v: str) -> tuple[tuple[str, float], ...]:
    """``KIND=SPEED,...`` -> ``((KIND, SPEED), ...)`` in the given order; every bad entry is named."""
    out: list[tuple[str, float]] = []
    seen: set[str] = set()
    errors: list[str] = []
    for item in (i.strip() for i in v.split(",")):
        if not item:
            continue
        kind, eq, raw = (x.strip() for x in item.partition("="))
        if not eq:
            errors.append(f"entry {item!r} is not KIND=SPEED")
            continue
        if not kind:
            errors.append(f"entry {item!r} has an empty slot kind")
            continue
        try:
            speed = float(raw)
        except ValueError:
            speed = math.nan
        if not (math.isfinite(speed) and speed > 0):
            errors.append(f"{kind}: speed {raw!r} must be a number > 0")
        elif kind.casefold() in seen:
            errors.append(f"{kind}: given twice")
        else:
            seen.add(kind.casefold())
            out.append((kind, speed))
    if errors:
        raise ValueError("; ".join(errors) + " (format: KIND=SPEED,..., e.g. L4=0.4,1g.10gb=0.25)")
    return tuple(out)


def _name(v: str) -> str:
    v = v.strip()
    if not v or len(v) > 63:
        raise ValueError("must be a non-empty name of at most 63 characters")
    return v


# annotation key (without prefix) -> (ModelSpec field, parser). The documented schema:
# docs/annotations.md lists exactly these keys.
SCHEMA: dict[str, tuple[str, Callable[[str], Any]]] = {
    "slo-latency-ms": ("slo_latency_ms", _positive_float),
    "slo-percentile": ("slo_percentile", _percentile),
    "slo-metric": ("slo_metric", _choice(SLO_METRICS)),
    "slo-itl-ms": ("slo_itl_ms", _positive_float),
    "min-replicas": ("min_replicas", _nonneg_int),
    "max-replicas": ("max_replicas", _positive_int),
    "gpu-memory-gib": ("gpu_memory_gib", _positive_float),
    "gpu-compute-share": ("gpu_compute_share", _share),
    "gpus-per-replica": ("gpus_per_replica", _positive_int),
    "slot-kinds": ("slot_kinds", _kinds),
    "slot-speeds": ("slot_speeds", _slot_speeds),
    "team": ("team", _name),
    "priority": ("priority", _int),
    "cold-start-seconds": ("cold_start_s", _nonneg_float),
    "service-time-ms": ("service_time_ms", _positive_float),
    "prefill-ms-per-1k-tokens": ("prefill_ms_per_1k_tokens", _nonneg_float),
    "decode-ms-per-token": ("decode_ms_per_token", _nonneg_float),
    "decode-batch-slowdown": ("decode_batch_slowdown", _slowdown),
    "concurrency": ("concurrency", _positive_int),
    "kv-cache-tokens": ("kv_cache_tokens", _positive_int),
    "expected-rps": ("expected_rps", _nonneg_float),
    "keep-alive": ("keep_alive", _choice(KEEP_ALIVE_POLICIES)),
    "keep-alive-seconds": ("keep_alive_s", _positive_float),
    "cold-start-worth-seconds": ("cold_start_worth_s", _nonneg_float),
}
REQUIRED = ("slo-latency-ms",)
# Keys that are not part of the model's spec and must not make it invalid: ``status`` (slotwise writes it and reads
# it back) and ``service`` (the Service that fronts the model, read by the Kubernetes adapter: live/kube/translate.py).
OWN_KEYS = ("status", "service")


@dataclass(frozen=True)
class SpecLimits:
    """The operator's caps on what one model's annotations may ask for (the settings' ``limits:``). A model over a
    cap is a spec error for that model naming the annotation, the value and the cap; the defaults are above what a
    real model declares and below what makes the decision path slow or overflow.

    ``max_time_slice_replicas`` is the most time-slice shares of one GPU (or MIG instance) slotwise plans: a model
    that may run on shares must ask for at least ``1 / max_time_slice_replicas`` of a GPU's compute, and the
    device plugin's time-slicing config is never raised past it (``decision/node_actions.py``).
    ``max_slot_speed`` bounds ``slot-speeds`` both ways: speeds in [1 / max_slot_speed, max_slot_speed]."""

    max_replicas: int = 1000
    max_concurrency: int = 4096
    max_gpus_per_replica: int = 64
    # A LeaderWorkerSet's group size (``pods_per_replica``, read from the workload): each replica's pods are
    # placed together, and a group far beyond what a cluster holds makes every placement try of it slow (issue 17).
    # Also bounds the group's GPUs: pods x gpus-per-replica <= max_gpus_per_replica.
    max_pods_per_replica: int = 64
    max_time_slice_replicas: int = 16
    max_priority: int = 1000  # |priority|; a team may cap it lower (teams[].max_priority)
    max_gpu_memory_gib: float = 4096.0
    max_latency_ms: float = 3_600_000.0  # slo-latency-ms, service-time-ms and the token costs (one hour)
    max_cold_start_s: float = 3600.0
    max_rps: float = 1_000_000.0  # expected-rps
    max_slot_speed: float = 1000.0
    # Floors, where a value too small is as harmful as one too large: an SLO below the median is no latency
    # objective, and a service time or SLO of 1e-300 ms underflows the queueing model (its latency search never
    # ended on either: issue 16).
    min_slo_percentile: float = 50.0
    min_latency_ms: float = 0.01

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            lo, hi = _LIMIT_RANGES.get(f.name, (1, 10**9 if f.type == "int" else 1e12))
            whole = f.type == "int"
            if not (isinstance(v, int if whole else int | float) and not isinstance(v, bool) and lo <= v <= hi):
                raise ValueError(f"limits.{f.name} must be {'a whole number' if whole else 'a number'} in "
                                 f"[{lo:g}, {hi:g}], got {v!r}")


_LIMIT_RANGES = {"min_slo_percentile": (1, 99), "min_latency_ms": (1e-6, 1000)}


# annotation key -> (ModelSpec field, SpecLimits field) for the keys whose cap is an upper bound on the value
_CAPPED: tuple[tuple[str, str, str], ...] = (
    ("max-replicas", "max_replicas", "max_replicas"),
    ("min-replicas", "min_replicas", "max_replicas"),
    ("concurrency", "concurrency", "max_concurrency"),
    ("gpus-per-replica", "gpus_per_replica", "max_gpus_per_replica"),
    ("gpu-memory-gib", "gpu_memory_gib", "max_gpu_memory_gib"),
    ("slo-latency-ms", "slo_latency_ms", "max_latency_ms"),
    ("slo-itl-ms", "slo_itl_ms", "max_latency_ms"),
    ("service-time-ms", "service_time_ms", "max_latency_ms"),
    ("prefill-ms-per-1k-tokens", "prefill_ms_per_1k_tokens", "max_latency_ms"),
    ("decode-ms-per-token", "decode_ms_per_token", "max_latency_ms"),
    ("cold-start-seconds", "cold_start_s", "max_cold_start_s"),
    ("expected-rps", "expected_rps", "max_rps"),
)


# Not an annotation: the workload's group size (a LeaderWorkerSet's spec.leaderWorkerTemplate.size).
PODS_PER_REPLICA_KEY = "pods-per-replica (the workload's group size)"


def limit_problems(spec: ModelSpec, limits: SpecLimits, key_prefix: str = PREFIX) -> list[SpecProblem]:
    """Every value of ``spec`` over the operator's caps (empty: within them), each naming the annotation, the
    value and the cap. Plain comparisons, cheap enough to run for every model on every tick."""
    if within_limits(spec, limits):
        return []
    problems: list[SpecProblem] = []
    for key, attr, cap_name in _CAPPED:
        v = getattr(spec, attr)
        cap = getattr(limits, cap_name)
        if v is not None and v > cap:
            problems.append(SpecProblem(key_prefix + key, _shown(v), f"above the cap limits.{cap_name} ({cap:g})"))
    for key, v in (("slo-latency-ms", spec.slo_latency_ms), ("service-time-ms", spec.service_time_ms),
                   ("slo-itl-ms", spec.slo_itl_ms)):
        if v is not None and v < limits.min_latency_ms:
            problems.append(SpecProblem(key_prefix + key, _shown(v),
                                        f"below the floor limits.min_latency_ms ({limits.min_latency_ms:g})"))
    if spec.slo_percentile < limits.min_slo_percentile:
        problems.append(SpecProblem(key_prefix + "slo-percentile", _shown(spec.slo_percentile),
                                    f"below the floor limits.min_slo_percentile ({limits.min_slo_percentile:g})"))
    pods, gpus = spec.pods_per_replica, spec.gpus_per_replica
    if pods > limits.max_pods_per_replica:
        problems.append(SpecProblem(PODS_PER_REPLICA_KEY, _shown(pods),
                                    f"above the cap limits.max_pods_per_replica ({limits.max_pods_per_replica})"))
    elif pods > 1 and pods * gpus > limits.max_gpus_per_replica:
        problems.append(SpecProblem(PODS_PER_REPLICA_KEY, f"{pods} pods x {gpus} GPUs",
                                    f"a group of {pods * gpus} GPUs, above the cap limits.max_gpus_per_replica "
                                    f"({limits.max_gpus_per_replica})"))
    if abs(spec.priority) > limits.max_priority:
        problems.append(SpecProblem(key_prefix + "priority", _shown(spec.priority),
                                    f"beyond the cap limits.max_priority (+-{limits.max_priority})"))
    floor = 1.0 / limits.max_time_slice_replicas
    if "share" in spec.slot_kinds and spec.gpu_compute_share * limits.max_time_slice_replicas < 1.0 - 1e-9:
        problems.append(SpecProblem(
            key_prefix + "gpu-compute-share", _shown(spec.gpu_compute_share),
            f"below 1/limits.max_time_slice_replicas ({floor:g}: at most {limits.max_time_slice_replicas} "
            "time-slice shares per GPU); ask for a larger share or leave out slot kind share"))
    hi = limits.max_slot_speed
    for kind, speed in spec.slot_speeds:
        if not (1.0 / hi <= speed <= hi):
            problems.append(SpecProblem(key_prefix + "slot-speeds", f"{kind}={speed:g}",
                                        f"speed outside [1/limits.max_slot_speed, limits.max_slot_speed] "
                                        f"([{1.0 / hi:g}, {hi:g}])"))
    return problems


def within_limits(s: ModelSpec, lim: SpecLimits) -> bool:
    """The common case of :func:`limit_problems` in one expression (a thousand models' admission in about a
    millisecond): every cap met. Optional values (None) are met; the order puts the likeliest breaches first."""
    latency = lim.max_latency_ms
    if not (s.max_replicas <= lim.max_replicas and s.min_replicas <= lim.max_replicas
            and s.concurrency <= lim.max_concurrency and s.gpus_per_replica <= lim.max_gpus_per_replica
            and s.pods_per_replica <= lim.max_pods_per_replica
            and s.pods_per_replica * s.gpus_per_replica <= lim.max_gpus_per_replica
            and -lim.max_priority <= s.priority <= lim.max_priority
            and s.slo_latency_ms <= latency and s.service_time_ms <= latency and s.cold_start_s <= lim.max_cold_start_s
            and s.slo_percentile >= lim.min_slo_percentile
            and s.slo_latency_ms >= lim.min_latency_ms and s.service_time_ms >= lim.min_latency_ms
            and (s.gpu_memory_gib is None or s.gpu_memory_gib <= lim.max_gpu_memory_gib)
            and (s.prefill_ms_per_1k_tokens is None or s.prefill_ms_per_1k_tokens <= latency)
            and (s.decode_ms_per_token is None or s.decode_ms_per_token <= latency)
            and (s.slo_itl_ms is None or lim.min_latency_ms <= s.slo_itl_ms <= latency)
            and (s.expected_rps is None or s.expected_rps <= lim.max_rps)):
        return False
    if "share" in s.slot_kinds and s.gpu_compute_share * lim.max_time_slice_replicas < 1.0 - 1e-9:
        return False
    hi = lim.max_slot_speed
    for _kind, v in s.slot_speeds:  # noqa: SIM110 -- a loop, not all(<generator>): a third of the cost per model
        if not (1.0 / hi <= v <= hi):
            return False
    return True


def _shown(v: float) -> str:
    """A value as the error shows it: a huge whole number by its size (its digits would fill the Event)."""
    if isinstance(v, int) and abs(v) >= 10**15:
        return f"{'-' if v < 0 else ''}~1e{len(str(abs(v))) - 1} ({len(str(abs(v)))} digits)"
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse_mapping(
    name: str,
    values: Mapping[str, Any],
    namespace: str = "default",
    defaults: ModelSpec | None = None,
    required: tuple[str, ...] = REQUIRED,
    key_prefix: str = "",
) -> ModelSpec:
    """Parse un-prefixed keys (``slo-latency-ms`` …) into a spec; raise SpecError listing every problem."""
    problems: list[SpecProblem] = []
    changes: dict[str, Any] = {}
    for key in required:
        if key not in values:
            problems.append(SpecProblem(key_prefix + key, "", "is required"))
    for key, raw in values.items():
        if key in OWN_KEYS:
            continue
        if key not in SCHEMA:
            problems.append(
                SpecProblem(key_prefix + key, str(raw), "unknown key (see docs/annotations.md for the schema)")
            )
            continue
        field_name, parse = SCHEMA[key]
        text = str(raw).strip()
        try:
            changes[field_name] = parse(text)
        except ValueError as e:
            problems.append(SpecProblem(key_prefix + key, text, str(e) or "invalid value"))
    base = defaults or ModelSpec(name=name, namespace=namespace)
    if not problems:
        lo = changes.get("min_replicas", base.min_replicas)
        hi = changes.get("max_replicas", base.max_replicas)
        if lo > hi:
            problems.append(
                SpecProblem(key_prefix + "min-replicas", str(lo), f"is greater than max-replicas ({hi})")
            )
        itl = changes.get("slo_itl_ms", base.slo_itl_ms)
        if itl is not None and changes.get("decode_ms_per_token", base.decode_ms_per_token) is None:
            # the ITL of one request decoding alone is what the ITL model grows from: without it there is nothing
            # to size an ITL target with
            problems.append(SpecProblem(key_prefix + "slo-itl-ms", _shown(itl),
                                        "needs decode-ms-per-token (the ITL of a request decoding alone)"))
    if problems:
        raise SpecError(f"{namespace}/{name}", problems)
    return replace(base, name=name, namespace=namespace, **changes)


def parse_annotations(
    name: str, annotations: Mapping[str, str], namespace: str = "default", defaults: ModelSpec | None = None
) -> ModelSpec:
    """Parse a Deployment's ``slotwise.io/*`` annotations (others are ignored)."""
    ours = {k[len(PREFIX) :]: v for k, v in annotations.items() if k.startswith(PREFIX)}
    return parse_mapping(name, ours, namespace=namespace, defaults=defaults, key_prefix=PREFIX)


def is_managed(annotations: Mapping[str, str]) -> bool:
    """A Deployment is managed by slotwise when it declares a latency SLO."""
    return PREFIX + "slo-latency-ms" in annotations


def slot_request(spec: ModelSpec) -> SlotRequest:
    """The slot shape one replica of ``spec`` needs: what the packer places."""
    return SlotRequest(
        model=spec.name,
        memory_gib=spec.gpu_memory_gib,
        compute_fraction=spec.gpu_compute_share,
        gpus=spec.gpus_per_replica,
        kinds=spec.slot_kinds,
        cpu_millis=spec.cpu_millis,
        host_memory_gib=spec.host_memory_gib,
    )


def replica_speed(spec: ModelSpec, slot: Slot, catalog: Catalog | None = None) -> float:
    """How fast one replica of ``spec`` serves on ``slot``, relative to what its service-time fields describe (one
    whole H100-80GB, or its ``gpu-compute-share`` of one): its ``slot-speeds`` entry for the slot's kind, else the
    published table (:func:`sharing.slot_speed.speed_of`). Size for that slot with the profile scaled by
    ``1 / speed``."""
    return speed_of(slot, spec.slot_speeds, catalog, spec.gpu_compute_share)
