"""Operations on canonical traces."""

from __future__ import annotations

import math
from dataclasses import replace

from forecasting.traces.convert import to_rate_series
from forecasting.traces.model import RateSeries, RequestLog, Trace


def _requests(log: RequestLog, part: slice, shift_s: float = 0.0) -> RequestLog:
    """The requests ``part`` of ``log`` (with every per-request column), their times moved by ``-shift_s``."""

    def cut(a):  # type: ignore[no-untyped-def]
        return None if a is None else a[part]

    return replace(
        log,
        t=log.t[part] - shift_s if shift_s else log.t[part],
        model_index=log.model_index[part],
        input_tokens=cut(log.input_tokens),
        output_tokens=cut(log.output_tokens),
        service_s=cut(log.service_s),
    )


def head(trace: Trace, seconds: float) -> Trace:
    """The first ``seconds`` of a trace (same models, same origin)."""
    if seconds <= 0:
        raise ValueError("the slice length must be positive")
    if isinstance(trace, RequestLog):
        return _requests(trace, slice(0, int((trace.t < seconds).sum())))
    assert isinstance(trace, RateSeries)
    steps = max(1, math.ceil(seconds / trace.step_s))
    return replace(trace, rates=trace.rates[:, :steps])


def split(trace: Trace, seconds: float, step_s: float = 60.0) -> tuple[RateSeries, Trace]:
    """(past, rest): the first ``seconds`` as a rate series (a request log is binned into ``step_s``
    counts), and the rest of the trace with its origin moved to 0 -- a forecaster's history and the
    part to simulate."""
    if seconds <= 0:
        raise ValueError("the history length must be positive")
    if seconds >= trace.duration_s:
        raise ValueError(f"the history ({seconds:g} s) must be shorter than the trace ({trace.duration_s:g} s)")
    if isinstance(trace, RequestLog):
        steps = max(1, int(seconds // step_s))
        cut = steps * step_s
        n = int((trace.t < cut).sum())
        past = to_rate_series(trace, step_s, n_steps=steps)
        return past, _requests(trace, slice(n, None), shift_s=cut)
    assert isinstance(trace, RateSeries)
    steps = max(1, int(round(seconds / trace.step_s)))
    past = replace(trace, rates=trace.rates[:, :steps])
    rest = replace(trace, rates=trace.rates[:, steps:])  # same origin: the simulated part starts at it
    return past, rest
