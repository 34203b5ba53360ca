"""Operations on canonical traces."""

from __future__ import annotations

import math
from dataclasses import replace

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
