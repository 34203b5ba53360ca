"""Which series a model server exports and which labels name the model (:class:`MetricNames`), and the presets for
the servers slotwise knows (vLLM, SGLang, TGI, Triton): what :mod:`autoscaler.live.prometheus.metrics` queries."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MetricNames:
    """Which series a model server exports, and which labels name the model.

    ``requests``: counter of finished requests. ``e2e_histogram`` / ``ttft_histogram`` / ``itl_histogram``: latency
    histograms (base names, without ``_bucket``; ``itl``: inter-token latency, the engine's ITL/TPOT), bucket bounds in
    units of ``histogram_unit_s`` seconds.
    ``waiting`` / ``running``: gauges of queued / executing requests. ``duration_sum``: a counter of summed
    request latency in units of ``duration_unit_s`` (Triton's ``nv_inference_request_duration_us``): the
    mean-latency fallback without a histogram, and in-flight by Little's law without a running gauge.
    ``key_labels``: (namespace label, model label) -> model key ``"<ns>/<model>"`` (one label: its value is
    the key). ``matchers``: extra PromQL label matchers put on every selector, e.g. ``job="vllm"``.
    ``kv_cache``: a gauge of each replica's KV-cache use, read as ``value * kv_cache_unit`` = the fraction used
    (``kv_cache_unit`` 1.0: the gauge is a fraction 0..1, as vLLM's, SGLang's and TensorRT-LLM's are; 0.01: a
    percent), averaged over the model's series; ``kv_cache_matchers``: matchers on that gauge only (TensorRT-LLM's
    ``kv_cache_block_type="fraction"``). Every name but ``requests`` is optional (None: not read). The presets and
    what each engine exports: docs/metrics.md.
    """

    requests: str
    e2e_histogram: str | None = None
    ttft_histogram: str | None = None
    waiting: str | None = None
    running: str | None = None
    duration_sum: str | None = None
    histogram_unit_s: float = 1.0
    duration_unit_s: float = 1.0
    key_labels: tuple[str, ...] = ("namespace", "model_name")
    matchers: str = ""
    itl_histogram: str | None = None
    kv_cache: str | None = None
    kv_cache_unit: float = 1.0
    kv_cache_matchers: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_labels", tuple(self.key_labels))
        if not self.requests:
            raise ValueError("MetricNames.requests (the finished-request counter) is required")
        if not 1 <= len(self.key_labels) <= 2 or not all(self.key_labels):
            raise ValueError(f"key_labels must be one or two label names, got {self.key_labels!r}")
        for unit in (self.histogram_unit_s, self.duration_unit_s):
            if not (math.isfinite(unit) and unit > 0):
                raise ValueError(f"units must be positive seconds, got {unit!r}")
        if not (math.isfinite(self.kv_cache_unit) and self.kv_cache_unit > 0):
            raise ValueError(f"kv_cache_unit must be positive (1.0: a fraction, 0.01: percent), got "
                             f"{self.kv_cache_unit!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> MetricNames:
        """The names a known server exports (``vllm``, ``vllm-v0``, ``sglang``, ``tgi``, ``triton``: docs/metrics.md);
        ``overrides`` replace fields."""
        try:
            base = _PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown metrics preset {name!r}; known: {sorted(_PRESETS)}") from None
        return dataclasses.replace(base, **overrides) if overrides else base

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricNames:
        """From a config mapping: ``{"preset": "vllm", "key_labels": ["namespace", "model"], ...}``; fields
        not given come from the preset (default ``vllm``). Unknown keys are an error (a typo must not pass)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields - {"preset"})
        if unknown:
            raise ValueError(f"unknown metric-name setting(s) {unknown}; known: {sorted(fields | {'preset'})}")
        overrides = {k: v for k, v in data.items() if k != "preset"}
        if "key_labels" in overrides:
            overrides["key_labels"] = tuple(overrides["key_labels"])
        return cls.preset(str(data.get("preset", "vllm")), **overrides)

    def key(self, labels: Mapping[str, str]) -> str:
        """The model key of a series: its ``key_labels`` values joined by ``/`` (``"<namespace>/<model>"``)."""
        return "/".join(labels.get(k, "") for k in self.key_labels)


_PRESETS = {
    # vLLM 0.11 and later (vllm/v1/metrics/loggers.py): every series carries model_name (and engine, one per
    # data-parallel engine); request_success also finished_reason. kv_cache_usage_perc is a fraction despite its name
    # ("1 means 100 percent usage"); inter_token_latency_seconds replaced time_per_output_token_seconds in 0.11.
    "vllm": MetricNames(
        requests="vllm:request_success_total",
        e2e_histogram="vllm:e2e_request_latency_seconds",
        ttft_histogram="vllm:time_to_first_token_seconds",
        itl_histogram="vllm:inter_token_latency_seconds",
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_cache="vllm:kv_cache_usage_perc",
        key_labels=("namespace", "model_name"),
    ),
    # vLLM before 0.11, the V0 engine included: the names before the renames (gpu_cache_usage_perc became
    # kv_cache_usage_perc in 0.9 and was hidden from 0.10; time_per_output_token_seconds became
    # inter_token_latency_seconds in 0.11). On 0.10 set kv_cache="vllm:kv_cache_usage_perc" (docs/metrics.md).
    "vllm-v0": MetricNames(
        requests="vllm:request_success_total",
        e2e_histogram="vllm:e2e_request_latency_seconds",
        ttft_histogram="vllm:time_to_first_token_seconds",
        itl_histogram="vllm:time_per_output_token_seconds",
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_cache="vllm:gpu_cache_usage_perc",
        key_labels=("namespace", "model_name"),
    ),
    # SGLang (python/sglang/srt/metrics/collector.py): every series carries model_name (the served model name). The
    # request counter counts finished requests; token_usage is the KV pool's used fraction (0..1).
    "sglang": MetricNames(
        requests="sglang:num_requests_total",
        e2e_histogram="sglang:e2e_request_latency_seconds",
        ttft_histogram="sglang:time_to_first_token_seconds",
        itl_histogram="sglang:inter_token_latency_seconds",
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_cache="sglang:token_usage",
        key_labels=("namespace", "model_name"),
    ),
    # Hugging Face TGI (router, docs/source/reference/metrics.md): one model per server and NO model label, so the
    # model is named by a target label -- ``service``, which a prometheus-operator ServiceMonitor adds (the Service
    # named like the workload), else relabel or set key_labels. Counters have no _total suffix; every *_duration is
    # a histogram in seconds. No TTFT histogram (a ttft SLO reads end-to-end) and no KV-cache gauge.
    "tgi": MetricNames(
        requests="tgi_request_success",
        e2e_histogram="tgi_request_duration",
        itl_histogram="tgi_request_mean_time_per_token_duration",
        waiting="tgi_queue_size",
        running="tgi_batch_current_size",
        key_labels=("namespace", "service"),
    ),
    # Triton's default exporter: per (model, version) counters of successes and cumulative microseconds,
    # and a pending-request gauge (queued, not yet executing). No latency histogram by default (hence the
    # mean-latency fallback); with --metrics-config histogram_latencies=true set e.g.
    # ttft_histogram="nv_inference_first_response_histogram_ms", histogram_unit_s=0.001.
    # The TensorRT-LLM backend adds its KV-cache block gauge (the used fraction is one kv_cache_block_type); other
    # backends have none (NaN, no effect).
    "triton": MetricNames(
        requests="nv_inference_request_success",
        waiting="nv_inference_pending_request_count",
        duration_sum="nv_inference_request_duration_us",
        duration_unit_s=1e-6,
        kv_cache="nv_trt_llm_kv_cache_block_metrics",
        kv_cache_matchers='kv_cache_block_type="fraction"',
        key_labels=("namespace", "model"),
    ),
}


def preset_names() -> tuple[str, ...]:
    """The known model-server presets (``MetricNames.preset``), sorted: what ``--metrics-preset`` accepts."""
    return tuple(sorted(_PRESETS))
