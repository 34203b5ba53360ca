"""Operations on canonical traces."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from forecasting.traces.model import RateSeries, RequestLog, Trace


def head(trace: Trace, seconds: float) -> Trace:
    """The first ``seconds`` of a trace (same models, same origin)."""
    if seconds <= 0:
        raise ValueError("the slice length must be positive")
    if isinstance(trace, RequestLog):
        n = int((trace.t < seconds).sum())

        def cut(a):  # type: ignore[no-untyped-def]
            return None if a is None else a[:n]

        return replace(
            trace,
            t=trace.t[:n],
            model_index=trace.model_index[:n],
            input_tokens=cut(trace.input_tokens),
            output_tokens=cut(trace.output_tokens),
            service_s=cut(trace.service_s),
        )
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
        counts = np.zeros((len(trace.models), steps))
        np.add.at(counts, (trace.model_index[:n], (trace.t[:n] // step_s).astype(np.int64)), 1.0)
        past = RateSeries(rates=counts / step_s, models=trace.models, step_s=step_s, source=trace.source)

        def rest_of(a):  # type: ignore[no-untyped-def]
            return None if a is None else a[n:]

        rest = replace(
            trace,
            t=trace.t[n:] - cut,
            model_index=trace.model_index[n:],
            input_tokens=rest_of(trace.input_tokens),
            output_tokens=rest_of(trace.output_tokens),
            service_s=rest_of(trace.service_s),
        )
        return past, rest
    assert isinstance(trace, RateSeries)
    steps = max(1, int(round(seconds / trace.step_s)))
    past = replace(trace, rates=trace.rates[:, :steps])
    rest = replace(trace, rates=trace.rates[:, steps:])  # same origin: the simulated part starts at it
    return past, rest
