"""Scenario files for ``slotwise simulate --scenario FILE`` (issue 9): teams, models, training, cluster, events.

One YAML file declares a whole simulated day; :func:`load_scenario` reads and validates it in one place and every
problem names the file and the key path (``failure-day.yaml: models[2].slo-latency-ms: ...``); unknown keys are
errors. The schema::

    name: resource-tight-day          # optional, default: the file name
    description: ...                  # optional
    duration: 2                       # hours simulated (required, > 0)
    history: 0                        # hours before them: the forecaster's warm start (default 0)
    request_timeout_s: 60             # a request not completed within it counts as failed (success rate; default 60)
    teams:                            # required, at least one
      - name: search
        guaranteed_gpus: 8            # GPU-equivalents it always gets when its models need them (default 0)
        borrowing_limit_gpus: 4       # at most this many more, of what others do not use (absent or null: no limit)
    arbitration:                      # optional: who gets GPUs when they run out (autoscaler/decision/arbitration/)
      mode: slo                       # slo (default) | priority | partition (the baselines)
      preemption: true                # may drain replicas of other models (default true)
      min_runtime_s: 300              # a replica younger than this is not preempted for priority (default 300)
      max_preemptions_per_tick: 8     # (default 8)
      fairness_half_life_s: 3600      # how long a team's borrowing is remembered (default 3600)
    models:                           # required, at least one
      - name: chat                    # unique
        team: search                  # one of teams (default: the first team)
        priority: 100                 # higher first (default 0)
        trace: azure-llm-2023         # a bundled trace name or a trace file (relative to the scenario file)
        model: conv                   # the model within it (required when the trace has more than one)
        scale: 2.0                    # arrival-rate multiplier (default 1)
        offset: 6                     # hours into the trace where the scenario starts (default 0)
        slo-latency-ms: 2000          # ... any key of docs/annotations.md (parsed by autoscaler.api.spec)
    training:                         # optional: the preemptible training backlog (as --training ...)
      source: alibaba-gpu-v2023-default-be   # bundled name or file
      checkpoint_every_s: 1800
      grace_s: 30
      lending: true                   # lend idle GPUs to it (as --lending)
      static_gpus: 0                  # or a static split (as --static-training-gpus)
    cluster: "16xH100-80GB:mig,8xL4"  # the grammar of sharing/cluster.py, text or list of entries (required)
    events:                           # optional
      - {at: "01:00", kind: node_lost, node: h100-80gb-1}       # a node by name ...
      - {at: 3600, kind: node_lost, gpu_kind: H100-80GB, count: 1}   # ... or N nodes of a GPU kind (those
        holding the most replica GPUs; with ``holding: search``: the most of that team's or model's replicas)
      - {at: "01:30", kind: gpu_kind_removed, gpu_kind: L4}
      - {at: "00:30", kind: surge, target: chat, multiplier: 2, duration_s: 900}  # model, team or "all"

``at`` is seconds into the simulated period or ``"HH:MM"``. Every source is binned to one-minute rates (a request
log's per-request token counts become the model's mean service time: ``prefill x mean input / 1k + decode x mean
output``, unless ``service-time-ms`` is given), multiplied by ``scale``; a source shorter than the scenario repeats.
A surge multiplies the rates of its models over ``[at, at + duration_s)`` (fractions of a minute pro rata).
Node loss and GPU kind removal are :class:`autoscaler.sim.run.ClusterEvent` s carried out by the simulator.
``teams`` and ``arbitration`` become one :class:`autoscaler.decision.arbitration.ArbitrationPolicy`
(``Scenario.arbitration``),
the decision core's arbitration in the simulation.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoscaler.api.spec import ModelSpec, SpecError, slot_request
from autoscaler.decision.arbitration import ARBITRATION_MODES, ArbitrationPolicy, TeamQuota
from autoscaler.estimation.capacity import min_replicas_for_slo
from autoscaler.sim.defaults import default_model_values, parse_model_values
from autoscaler.sim.run import ClusterEvent, SimConfig
from autoscaler.sim.training import load_training
from autoscaler.sim.workload import SimWorkload
from forecasting.traces.model import RateSeries, RequestLog, Trace
from sharing.lending import LendingPolicy
from sharing.packer import CostAwarePacker
from sharing.slots import Inventory, NodeSpec

STEP_S = 60.0
EVENT_KINDS = ("node_lost", "gpu_kind_removed", "surge")
_TOP_KEYS = {"name", "description", "duration", "history", "request_timeout_s", "teams", "arbitration", "models",
             "training", "cluster", "events"}
_TEAM_KEYS = {"name", "guaranteed_gpus", "borrowing_limit_gpus"}
_ARBITRATION_KEYS = {"mode", "preemption", "min_runtime_s", "max_preemptions_per_tick", "fairness_half_life_s"}
DEFAULT_REQUEST_TIMEOUT_S = 60.0
_MODEL_OWN_KEYS = {"name", "trace", "model", "scale", "offset"}  # the rest are annotation keys
_TRAINING_KEYS = {"source", "checkpoint_every_s", "grace_s", "lending", "static_gpus"}
_EVENT_KEYS = {
    "node_lost": {"at", "kind", "node", "gpu_kind", "count", "holding"},
    "gpu_kind_removed": {"at", "kind", "gpu_kind"},
    "surge": {"at", "kind", "target", "multiplier", "duration_s"},
}


class ScenarioError(ValueError):
    """A scenario file is invalid: every problem, each as ``file: key.path: message``."""

    def __init__(self, path: str, problems: Sequence[tuple[str, str]]) -> None:
        self.path = path
        self.problems = list(problems)
        name = os.path.basename(path)
        super().__init__("\n".join(f"{name}: {k}: {m}" if k else f"{name}: {m}" for k, m in self.problems))


# A scenario's team is the arbitration's quota (borrowing_limit_gpus None: no limit).
Team = TeamQuota


@dataclass(frozen=True)
class ScenarioModel:
    name: str
    spec: ModelSpec
    trace: str
    model: str
    scale: float = 1.0
    offset_h: float = 0.0


@dataclass(frozen=True)
class Surge:
    at_s: float
    target: str  # a model, a team, or "all"
    multiplier: float
    duration_s: float


@dataclass(frozen=True)
class TrainingConfig:
    source: str
    checkpoint_every_s: float
    grace_s: float
    lending: bool = True
    static_gpus: int = 0


@dataclass
class Scenario:
    path: str
    name: str
    description: str
    duration_h: float
    history_h: float
    teams: tuple[TeamQuota, ...]
    models: tuple[ScenarioModel, ...]
    cluster: list[NodeSpec]
    training: TrainingConfig | None = None
    cluster_events: tuple[ClusterEvent, ...] = ()
    surges: tuple[Surge, ...] = ()
    # the file's arbitration block with its teams (ArbitrationPolicy.from_mapping); the default when absent
    arbitration: ArbitrationPolicy = field(default_factory=ArbitrationPolicy)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    _traces: dict[str, Trace] = field(default_factory=dict, repr=False)

    @property
    def specs(self) -> dict[str, ModelSpec | SpecError]:
        return {m.name: m.spec for m in self.models}

    def surge_models(self, s: Surge) -> list[str]:
        if s.target == "all":
            return [m.name for m in self.models]
        if any(t.name == s.target for t in self.teams):
            return [m.name for m in self.models if m.spec.team == s.target]
        return [s.target]

    def build_trace(self, duration_h: float | None = None) -> RateSeries:
        """One-minute rates of every model over history + duration (``duration_h`` overrides the file's),
        scaled and surged."""
        hist_s = self.history_h * 3600.0
        total_s = hist_s + (duration_h if duration_h is not None else self.duration_h) * 3600.0
        n = max(1, int(math.ceil(total_s / STEP_S - 1e-9)))
        rates = np.zeros((len(self.models), n))
        for i, m in enumerate(self.models):
            trace = self._traces[m.trace]
            rates[i] = _minute_rates(trace, trace.models.index(m.model), m.offset_h * 3600.0, n) * m.scale
        index = {m.name: i for i, m in enumerate(self.models)}
        edges = np.arange(n + 1) * STEP_S
        for s in self.surges:
            lo, hi = hist_s + s.at_s, hist_s + s.at_s + s.duration_s
            overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0.0, None) / STEP_S
            factor = 1.0 + (s.multiplier - 1.0) * overlap
            for name in self.surge_models(s):
                rates[index[name]] *= factor
        return RateSeries(rates, tuple(m.name for m in self.models), STEP_S, source=self.path)

    def sim_config(self, hours: float | None = None, **settings: Any) -> SimConfig:
        """The simulator's settings for this scenario: its cluster events (those before the end of ``hours``, by
        default the file's duration), arbitration, request timeout and training backlog (lent to, or a static
        split); ``settings`` (tick_s, mode, seed, ...) are passed on."""
        end_s = (hours if hours is not None else self.duration_h) * 3600.0
        extra: dict[str, Any] = {}
        if self.training is not None:
            t = self.training
            if t.lending:
                extra["lending"] = LendingPolicy(enabled=True)
            extra["static_training_gpus"] = t.static_gpus
            extra["training"] = load_training(t.source, t.checkpoint_every_s, t.grace_s)
        events = tuple(e for e in self.cluster_events if e.at_s < end_s)
        return SimConfig(events=events, arbitration=self.arbitration, request_timeout_s=self.request_timeout_s,
                         **extra, **settings)

    def fired_surges(self) -> list[dict[str, object]]:
        return [{"at_s": s.at_s, "kind": "surge", "target": s.target, "multiplier": s.multiplier,
                 "duration_s": s.duration_s, "models": self.surge_models(s)} for s in self.surges]


def _minute_rates(trace: Trace, row: int, offset_s: float, n: int) -> np.ndarray:
    """Model ``row`` of ``trace`` as ``n`` one-minute rates from ``offset_s`` on, repeating the trace if short."""
    if isinstance(trace, RequestLog):
        t = trace.t[trace.model_index == row]
        length = max(STEP_S, math.ceil(trace.duration_s / STEP_S) * STEP_S)
        base = np.bincount((t // STEP_S).astype(np.int64), minlength=int(length // STEP_S))[: int(length // STEP_S)]
        base = base / STEP_S
        start = 0.0
    else:
        r = np.nan_to_num(trace.rates[row], nan=0.0)
        cum = np.concatenate([[0.0], np.cumsum(r * trace.step_s)])
        grid = np.arange(len(cum)) * trace.step_s
        steps = int(trace.duration_s // STEP_S)
        base = np.diff(np.interp(np.arange(steps + 1) * STEP_S, grid, cum)) / STEP_S
        start = 0.0
    k0 = int(round((offset_s - start) / STEP_S))
    if base.size == 0:
        return np.zeros(n)
    idx = (k0 + np.arange(n)) % base.size
    return base[idx]


def _at_seconds(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("must be seconds or 'HH:MM'")
    if isinstance(v, (int, float)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError("must be >= 0 seconds")
        return float(v)
    if isinstance(v, str) and ":" in v:
        h, _, mm = v.strip().partition(":")
        if h.isdigit() and mm.isdigit() and len(mm) == 2 and int(mm) < 60:
            return int(h) * 3600.0 + int(mm) * 60.0
    raise ValueError(f"must be seconds or 'HH:MM', got {v!r}")


class _Checker:
    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[tuple[str, str]] = []

    def bad(self, key: str, msg: str) -> None:
        self.problems.append((key, msg))

    def keys(self, doc: Any, allowed: set[str], where: str) -> bool:
        if not isinstance(doc, Mapping):
            self.bad(where, "must be a mapping")
            return False
        for k in doc:
            if k not in allowed:
                self.bad(f"{where}.{k}" if where else str(k), f"unknown key (known: {', '.join(sorted(allowed))})")
        return True

    def number(self, doc: Mapping, key: str, where: str, default: float | None = None, low: float = 0.0,
               strict: bool = True) -> float | None:
        at = f"{where}.{key}" if where else key
        if key not in doc:
            if default is None:
                self.bad(at, "is required")
            return default
        v = doc[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            self.bad(at, f"must be a number, got {v!r}")
            return default
        if (v <= low) if strict else (v < low):
            self.bad(at, f"must be {'>' if strict else '>='} {low:g}")
            return default
        return float(v)

    def text(self, doc: Mapping, key: str, where: str, required: bool = True) -> str | None:
        at = f"{where}.{key}" if where else key
        if key not in doc:
            if required:
                self.bad(at, "is required")
            return None
        v = doc[key]
        if not isinstance(v, str) or not v.strip():
            self.bad(at, f"must be a non-empty string, got {v!r}")
            return None
        return v.strip()


def load_scenario(path: str) -> Scenario:
    """Read and validate a scenario file; raise :class:`ScenarioError` listing every problem."""
    import yaml

    from autoscaler.sim.training import bundled_training
    from forecasting.traces import resolve_trace
    from sharing.catalog import load_catalog
    from sharing.cluster import nodes_from_spec

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ScenarioError(path, [("", f"cannot read: {e.strerror or e}")]) from None
    except yaml.YAMLError as e:
        raise ScenarioError(path, [("", f"not valid YAML: {e}")]) from None
    c = _Checker(path)
    if not c.keys(doc, _TOP_KEYS, ""):
        raise ScenarioError(path, c.problems)
    here = os.path.dirname(os.path.abspath(path))
    name = c.text(doc, "name", "", required=False) or os.path.splitext(os.path.basename(path))[0]
    description = str(doc.get("description") or "")
    duration = c.number(doc, "duration", "", default=None)
    history = c.number(doc, "history", "", default=0.0, strict=False)

    timeout = c.number(doc, "request_timeout_s", "", default=DEFAULT_REQUEST_TIMEOUT_S)

    teams: list[TeamQuota] = []
    raw_teams = doc.get("teams")
    if not isinstance(raw_teams, list) or not raw_teams:
        c.bad("teams", "is required: a non-empty list of teams")
        raw_teams = []
    team_docs: list[dict[str, Any]] = []  # the valid entries, as ArbitrationPolicy.from_mapping takes them
    for i, t in enumerate(raw_teams):
        w = f"teams[{i}]"
        if not c.keys(t, _TEAM_KEYS, w):
            continue
        tname = c.text(t, "name", w)
        g = c.number(t, "guaranteed_gpus", w, default=0.0, strict=False)
        # absent (or null): the team may borrow without limit
        b = (c.number(t, "borrowing_limit_gpus", w, default=0.0, strict=False)
             if t.get("borrowing_limit_gpus") is not None else None)
        if tname is not None:
            if any(x.name == tname for x in teams):
                c.bad(f"{w}.name", f"duplicate team {tname!r}")
                continue
            teams.append(TeamQuota(tname, g or 0.0, b))
            team_docs.append({"name": tname, "guaranteed_gpus": g or 0.0, "borrowing_limit_gpus": b})
    team_names = [t.name for t in teams]
    arbitration = _arbitration(c, doc.get("arbitration"), team_docs)

    traces: dict[str, Trace] = {}
    models: list[ScenarioModel] = []
    raw_models = doc.get("models")
    if not isinstance(raw_models, list) or not raw_models:
        c.bad("models", "is required: a non-empty list of models")
        raw_models = []
    for i, m in enumerate(raw_models):
        w = f"models[{i}]"
        if not isinstance(m, Mapping):
            c.bad(w, "must be a mapping")
            continue
        mname = c.text(m, "name", w)
        src = c.text(m, "trace", w)
        scale = c.number(m, "scale", w, default=1.0)
        offset = c.number(m, "offset", w, default=0.0, strict=False)
        if mname is not None and any(x.name == mname for x in models):
            c.bad(f"{w}.name", f"duplicate model {mname!r}")
        trace = None
        key = None
        if src is not None:
            key = os.path.join(here, src) if os.path.exists(os.path.join(here, src)) else src
            try:
                trace = traces[key] if key in traces else resolve_trace(key)
                traces[key] = trace
            except (OSError, ValueError) as e:
                c.bad(f"{w}.trace", str(e))
        inner = m.get("model")
        if trace is not None:
            if inner is None and len(trace.models) == 1:
                inner = trace.models[0]
            if inner is None:
                c.bad(f"{w}.model", f"is required: {src} has {len(trace.models)} models")
            elif str(inner) not in trace.models:
                shown = ", ".join(trace.models[:5]) + (" ..." if len(trace.models) > 5 else "")
                c.bad(f"{w}.model", f"{inner!r} is not a model of {src} ({shown})")
                inner = None
        values = {k: v for k, v in m.items() if k not in _MODEL_OWN_KEYS}
        team = values.get("team", team_names[0] if team_names else "default")
        if team_names and str(team) not in team_names:
            c.bad(f"{w}.team", f"{team!r} is not one of the teams ({', '.join(team_names)})")
        if trace is None or inner is None or mname is None:
            continue
        base = dict(default_model_values(trace)[str(inner)])
        if isinstance(trace, RequestLog) and "service-time-ms" not in values:
            base["service-time-ms"] = _llm_service_ms(trace, trace.models.index(str(inner)), {**base, **values})
        try:
            spec = parse_model_values(mname, {**base, "team": team, **values})
        except SpecError as e:
            for p in e.problems:
                c.bad(f"{w}.{p.key}", p.reason + (f" (got {p.value!r})" if p.value else ""))
            continue
        models.append(ScenarioModel(mname, spec, key or src, str(inner), scale or 1.0, offset or 0.0))

    training = None
    if doc.get("training") is not None:
        t = doc["training"]
        if c.keys(t, _TRAINING_KEYS, "training"):
            src = c.text(t, "source", "training")
            ckpt = c.number(t, "checkpoint_every_s", "training", default=1800.0)
            grace = c.number(t, "grace_s", "training", default=30.0, strict=False)
            lending = t.get("lending", True)
            if not isinstance(lending, bool):
                c.bad("training.lending", f"must be true or false, got {lending!r}")
            static = t.get("static_gpus", 0)
            if isinstance(static, bool) or not isinstance(static, int) or static < 0:
                c.bad("training.static_gpus", f"must be an integer >= 0, got {static!r}")
                static = 0
            if src is not None:
                local = os.path.join(here, src)
                if os.path.exists(local):
                    src = local
                elif src.strip().lower() not in bundled_training():
                    c.bad("training.source", f"{src}: no such file, nor a bundled training source "
                                             f"({', '.join(bundled_training()) or 'none'})")
                training = TrainingConfig(src, ckpt or 1800.0, grace or 0.0, bool(lending), static)

    nodes: list[NodeSpec] = []
    if "cluster" not in doc:
        c.bad("cluster", "is required: a cluster spec such as '16xH100-80GB:mig' or a list of node entries")
    else:
        try:
            nodes = nodes_from_spec(doc["cluster"])
        except (ValueError, KeyError, TypeError) as e:
            c.bad("cluster", str(e))

    events: list[ClusterEvent] = []
    surges: list[Surge] = []
    raw_events = doc.get("events") or []
    if not isinstance(raw_events, list):
        c.bad("events", "must be a list")
        raw_events = []
    node_names = {n.name for n in nodes}
    kinds = {load_catalog().get(n.gpu_model).name for n in nodes if n.gpu_count}
    model_names = {m.name for m in models} | {str(m.get("name")) for m in raw_models if isinstance(m, Mapping)}
    for i, e in enumerate(raw_events):
        w = f"events[{i}]"
        if not isinstance(e, Mapping):
            c.bad(w, "must be a mapping")
            continue
        kind = e.get("kind")
        if kind not in EVENT_KINDS:
            c.bad(f"{w}.kind", f"must be one of {', '.join(EVENT_KINDS)}, got {kind!r}")
            continue
        c.keys(e, _EVENT_KEYS[kind], w)
        at = None
        if "at" not in e:
            c.bad(f"{w}.at", "is required")
        else:
            try:
                at = _at_seconds(e["at"])
            except ValueError as x:
                c.bad(f"{w}.at", str(x))
        if at is not None and duration is not None and at >= duration * 3600.0:
            c.bad(f"{w}.at", f"is after the end of the scenario ({duration:g} h)")
        if kind == "surge":
            target = c.text(e, "target", w)
            mult = c.number(e, "multiplier", w, default=None)
            dur = c.number(e, "duration_s", w, default=None)
            if target is not None and target != "all" and target not in model_names and target not in team_names:
                c.bad(f"{w}.target", f"{target!r} is neither a model, a team nor 'all'")
            elif None not in (at, target, mult, dur):
                surges.append(Surge(at, target, mult, dur))  # type: ignore[arg-type]
            continue
        gpu_kind = None
        if "gpu_kind" in e:
            gpu_kind = c.text(e, "gpu_kind", w)
            if gpu_kind is not None:
                try:
                    canon = load_catalog().get(gpu_kind).name
                except (KeyError, ValueError) as x:
                    c.bad(f"{w}.gpu_kind", str(x).strip("'\""))
                    gpu_kind = None
                else:
                    if nodes and canon not in kinds:
                        c.bad(f"{w}.gpu_kind", f"no {canon} nodes in the cluster ({', '.join(sorted(kinds))})")
                        gpu_kind = None
        if kind == "gpu_kind_removed":
            if "gpu_kind" not in e:
                c.bad(f"{w}.gpu_kind", "is required")
            elif at is not None and gpu_kind is not None:
                events.append(ClusterEvent(at, kind, gpu_kind))
            continue
        # node_lost: a node by name, or count nodes of a GPU kind
        if ("node" in e) == ("gpu_kind" in e):
            c.bad(w, "node_lost needs either 'node' (a node name) or 'gpu_kind' with 'count'")
            continue
        if "node" in e:
            node = c.text(e, "node", w)
            if node is not None and nodes and node not in node_names:
                shown = ", ".join(sorted(node_names)[:6])
                c.bad(f"{w}.node", f"no node {node!r} in the cluster ({shown}{' ...' if len(node_names) > 6 else ''})")
            elif node is not None and at is not None:
                events.append(ClusterEvent(at, kind, node))
            continue
        count = e.get("count", 1)
        holding: tuple[str, ...] = ()
        if "holding" in e:
            who = e["holding"]
            holding = tuple(m.name for m in models if who in (m.name, m.spec.team))
            if not holding:
                c.bad(f"{w}.holding", f"no model or team {who!r} in the scenario")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            c.bad(f"{w}.count", f"must be an integer >= 1, got {count!r}")
        elif at is not None and gpu_kind is not None:
            events.append(ClusterEvent(at, kind, gpu_kind, count, holding))

    if c.problems:
        raise ScenarioError(path, c.problems)
    assert duration is not None and history is not None
    assert arbitration is not None and timeout is not None
    return Scenario(path, name, description, duration, history, arbitration.teams, tuple(models), nodes, training,
                    tuple(events), tuple(surges), arbitration, timeout, traces)


def _arbitration(c: _Checker, raw: Any, team_docs: list[dict[str, Any]]) -> ArbitrationPolicy | None:
    """The ``arbitration`` block (optional) with the teams as one policy; each bad value is reported under its
    key path here, so that ArbitrationPolicy's own checks only back this up."""
    if raw is None:
        raw = {}
    if not c.keys(raw, _ARBITRATION_KEYS, "arbitration"):
        return None
    ok = True
    mode = raw.get("mode", "slo")
    if mode not in ARBITRATION_MODES:
        c.bad("arbitration.mode", f"must be one of {', '.join(ARBITRATION_MODES)}, got {mode!r}")
        ok = False
    if "preemption" in raw and not isinstance(raw["preemption"], bool):
        c.bad("arbitration.preemption", f"must be true or false, got {raw['preemption']!r}")
        ok = False
    for knob in ("min_runtime_s", "fairness_half_life_s"):
        if knob in raw and c.number(raw, knob, "arbitration", default=None, strict=False) is None:
            ok = False
    if "max_preemptions_per_tick" in raw:
        v = raw["max_preemptions_per_tick"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            c.bad("arbitration.max_preemptions_per_tick", f"must be an integer >= 0, got {v!r}")
            ok = False
    if not ok or set(raw) - _ARBITRATION_KEYS:
        return None
    try:
        return ArbitrationPolicy.from_mapping(raw, team_docs)
    except ValueError as e:  # anything the checks above did not foresee, still under its block
        c.bad("arbitration", str(e))
        return None


def _llm_service_ms(log: RequestLog, row: int, values: Mapping[str, Any]) -> float:
    """Mean service time of a request log's model from its tokens and the spec's token rates (ms)."""
    sel = log.model_index == row
    if log.input_tokens is None or log.output_tokens is None or not sel.any():
        return float(values.get("service-time-ms", 500.0))
    try:
        prefill = float(values.get("prefill-ms-per-1k-tokens", 0.0))
        decode = float(values.get("decode-ms-per-token", 0.0))
    except (TypeError, ValueError):
        return 500.0  # parse_mapping reports the bad value
    ms = prefill * float(np.mean(log.input_tokens[sel])) / 1000.0 + decode * float(np.mean(log.output_tokens[sel]))
    return round(max(ms, 1.0), 3)


def demand_gpus(workload: SimWorkload, nodes: Sequence[NodeSpec]) -> dict[str, np.ndarray]:
    """Per team, the GPU-equivalents its models need each minute of the simulated period: the replicas each
    model needs
    for its SLO at that minute's mean arrival rate (:func:`autoscaler.estimation.capacity.min_replicas_for_slo` on
    its spec's profile, Poisson arrivals: bursts within the minute need more) times the GPU fraction of the slot the
    packer gives one replica on an empty node of the cluster's first kind. How tight a scenario is: the peak of
    the sum over the cluster's GPUs ("demand ~130 % of the GPUs at peak")."""
    first = nodes[0]
    out: dict[str, np.ndarray] = {}
    rates = workload.arrivals_per_tick(STEP_S) / STEP_S
    for i, name in enumerate(workload.models):
        spec = workload.specs[name]
        if not isinstance(spec, ModelSpec):
            continue
        empty = Inventory.from_nodes([NodeSpec("probe", first.gpu_model, max(first.gpu_count, spec.gpus_per_replica),
                                               first.mig_enabled)])
        slot = CostAwarePacker().place(empty, slot_request(spec))
        fraction = slot.gpu_fraction if slot is not None else float(spec.gpus_per_replica)
        if spec.pods_per_replica > 1:  # a replica that is a group of pods holds one such slot per pod
            fraction *= spec.pods_per_replica
        need = np.array([min_replicas_for_slo(float(r), workload.profiles[name]) for r in rates[i]]) * fraction
        out[spec.team] = out.get(spec.team, 0.0) + need
    return out
