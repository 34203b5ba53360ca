"""Default model specs and cluster for a trace, when the user gives no ``--models`` / ``--cluster``.

Rules, not per-file constants: what kind of trace it is decides the kind of model behind it.

- A request log with token counts is an LLM service: token-based service time (prefill per 1k input
  tokens + decode per output token, typical of a ~13B model on one H100-class GPU), continuous batching,
  a time-to-first-token SLO.
- A rate series with per-function durations (Azure Functions) is a fleet of small models: each
  function's mean duration (clipped to what a small model's request plausibly costs) as service time.
- Any other rate series is a pool of LLM clients with a generic service time.
Every value can be overridden by a models file (same keys as the annotations, see docs/annotations.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import yaml

from autoscaler.api.spec import ModelSpec, SpecError, SpecLimits, SpecProblem, parse_mapping
from forecasting.traces.model import RateSeries, RequestLog, Trace

LLM_DEFAULTS: dict[str, Any] = {
    "slo-latency-ms": 2000,
    "slo-percentile": 95,
    "slo-metric": "ttft",
    "prefill-ms-per-1k-tokens": 150,
    "decode-ms-per-token": 20,
    "concurrency": 8,
    "gpu-memory-gib": 40,
    "cold-start-seconds": 60,
    "min-replicas": 1,
    "max-replicas": 200,
}
FUNCTION_DEFAULTS: dict[str, Any] = {
    "slo-percentile": 95,
    "slo-metric": "e2e",
    "concurrency": 4,
    "gpu-memory-gib": 4,
    "gpu-compute-share": 0.1,
    "cold-start-seconds": 30,
    "min-replicas": 1,
    "max-replicas": 200,
}
CLIENT_DEFAULTS: dict[str, Any] = {
    "slo-latency-ms": 2000,
    "slo-percentile": 95,
    "slo-metric": "e2e",
    "service-time-ms": 500,
    "concurrency": 16,
    "gpu-memory-gib": 20,
    "cold-start-seconds": 90,
    "min-replicas": 1,
    "max-replicas": 500,
}
# A small model's request costs between 10 ms and 1 s however long the original function ran.
FUNCTION_SERVICE_MS = (10.0, 1000.0)


def durations_ms(trace: RateSeries) -> dict[str, Mapping[str, float]]:
    """Per-model duration statistics a reader attached (Azure Functions durations.csv), else {}."""
    meta = trace.meta.get("duration_ms") or {}
    return dict(meta) if isinstance(meta, Mapping) else {}


def trace_kind(trace: Trace) -> str:
    if isinstance(trace, RequestLog):
        return "llm" if trace.input_tokens is not None and trace.output_tokens is not None else "requests"
    return "functions" if durations_ms(trace) else "clients"


def _mean_duration(stats: Mapping[str, float] | float | None) -> float | None:
    if stats is None:
        return None
    if isinstance(stats, Mapping):
        for k in ("mean", "Average", "average", "duration_ms_mean"):
            if k in stats and math.isfinite(float(stats[k])):
                return float(stats[k])
        return None
    return float(stats)


def default_model_values(trace: Trace) -> dict[str, dict[str, Any]]:
    """Un-prefixed annotation values per model for ``trace``."""
    kind = trace_kind(trace)
    out: dict[str, dict[str, Any]] = {}
    if kind == "llm":
        return {m: dict(LLM_DEFAULTS) for m in trace.models}
    if kind == "requests":
        assert isinstance(trace, RequestLog)
        for i, m in enumerate(trace.models):
            vals = dict(CLIENT_DEFAULTS)
            if trace.service_s is not None:
                s = trace.service_s[trace.model_index == i]
                if s.size:
                    mean_ms = float(np.mean(s)) * 1000
                    vals["service-time-ms"] = round(max(mean_ms, 0.1), 3)
                    vals["slo-latency-ms"] = round(max(4 * mean_ms, float(np.quantile(s, 0.99)) * 1500), 1)
            out[m] = vals
        return out
    if kind == "functions":
        assert isinstance(trace, RateSeries)
        d = durations_ms(trace)
        lo, hi = FUNCTION_SERVICE_MS
        for m in trace.models:
            mean = _mean_duration(d.get(m))
            service = float(np.clip(mean if mean is not None else 100.0, lo, hi))
            vals = dict(FUNCTION_DEFAULTS)
            vals["service-time-ms"] = round(service, 3)
            # Small models: a latency target of a few service times (at least 100 ms).
            vals["slo-latency-ms"] = round(max(100.0, 5 * service), 1)
            out[m] = vals
        return out
    return {m: dict(CLIENT_DEFAULTS) for m in trace.models}


# Keys a models file or scenario model may give beside the annotation keys: what a live cluster reads from the
# workload, not from ``slotwise.io/*`` annotations. ``pods-per-replica``: a LeaderWorkerSet's group size (each
# replica is that many pods, each with the model's slot, placed together; ModelSpec.pods_per_replica).
SIM_KEYS = ("pods-per-replica",)
MAX_PODS_PER_REPLICA = SpecLimits().max_pods_per_replica  # the controller's default cap on a group's size


def parse_model_values(name: str, values: Mapping[str, Any]) -> ModelSpec:
    """A simulated model's spec: the annotation keys through :func:`autoscaler.api.spec.parse_mapping` (the one
    parser), plus :data:`SIM_KEYS`; raises SpecError naming every problem of the model, these keys' too."""
    rest = {k: v for k, v in values.items() if k not in SIM_KEYS}
    problems: list[SpecProblem] = []
    pods = 1
    if "pods-per-replica" in values:
        raw = str(values["pods-per-replica"]).strip()
        try:
            pods = int(raw)
        except ValueError:
            pods = 0
        if not 1 <= pods <= MAX_PODS_PER_REPLICA:
            problems.append(SpecProblem("pods-per-replica", raw,
                                        f"must be a whole number in [1, {MAX_PODS_PER_REPLICA}]"))
    try:
        spec = parse_mapping(name, rest)
    except SpecError as e:
        raise SpecError(e.model, [*e.problems, *problems]) from None
    if problems:
        raise SpecError(spec.key, problems)
    return spec if pods == 1 else spec.with_(pods_per_replica=pods)


def load_models_file(path: str) -> dict[str, Any]:
    """A models file: ``{defaults: {key: value}, models: {name: {key: value}}}`` (YAML or JSON)."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML/JSON: {e}") from None
    if not isinstance(doc, dict) or not set(doc) <= {"defaults", "models"}:
        raise ValueError(f"{path}: expected a mapping with keys 'defaults' and/or 'models'")
    return doc


def model_specs(trace: Trace, models_file: str | None = None) -> dict[str, ModelSpec | SpecError]:
    """Specs per model of the trace: trace defaults, then the file's defaults, then per-model values.

    A model whose values are invalid gets its SpecError (the simulator reports it and leaves that model
    unmanaged); the others run.
    """
    values = default_model_values(trace)
    doc = load_models_file(models_file) if models_file else {}
    common = doc.get("defaults") or {}
    per_model = doc.get("models") or {}
    if not isinstance(common, dict):
        raise ValueError(f"{models_file}: 'defaults' must be a mapping of annotation keys to values")
    if not isinstance(per_model, dict):
        raise ValueError(f"{models_file}: 'models' must be a mapping of model name to its values")
    for name, vals in per_model.items():
        if vals is not None and not isinstance(vals, dict):
            raise ValueError(f"{models_file}: models.{name} must be a mapping of annotation keys to values")
    unknown = set(per_model) - set(trace.models)
    if unknown:
        raise ValueError(f"{models_file}: models not in the trace: {', '.join(sorted(unknown))}")
    specs: dict[str, ModelSpec | SpecError] = {}
    for m in trace.models:
        merged = {**values[m], **common, **(per_model.get(m) or {})}
        try:
            specs[m] = parse_model_values(m, merged)
        except SpecError as e:
            specs[m] = e
    return specs
