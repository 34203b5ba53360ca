"""The two canonical trace shapes every reader produces, and the error every reader raises.

A *request log* lists individual requests (arrival time, model, optional tokens / service time).
A *rate series* gives, per model, requests per second over regular intervals.
The simulator consumes either; forecasters consume rate series.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class TraceFormatError(ValueError):
    """A trace file is malformed. Always names the file, the 1-based line and the field."""

    def __init__(self, path: str, line: int | None, field_name: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field_name
        self.message = message
        where = self.path
        if line is not None:
            where += f":{line}"
        if field_name:
            where += f": field '{field_name}'"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class RequestLog:
    """Individual requests, sorted by arrival time.

    ``model_index[i]`` indexes ``models``; token and service arrays are None when the trace lacks them.
    """

    t: np.ndarray  # float64 seconds from the start of the trace, non-decreasing
    model_index: np.ndarray  # int32, same length as t
    models: tuple[str, ...]
    input_tokens: np.ndarray | None = None  # int64
    output_tokens: np.ndarray | None = None  # int64
    service_s: np.ndarray | None = None  # float64, measured service time where the trace has it
    source: str = ""
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return float(self.t[-1]) if len(self.t) else 0.0

    def __len__(self) -> int:
        return int(len(self.t))


@dataclass(frozen=True)
class RateSeries:
    """Requests per second per model over regular intervals: ``rates[m, k]`` is the mean rate of
    model ``models[m]`` over ``[start_s + k*step_s, start_s + (k+1)*step_s)``. NaN marks a missing point."""

    rates: np.ndarray  # float64, shape (len(models), n_steps)
    models: tuple[str, ...]
    step_s: float
    start_s: float = 0.0
    source: str = ""
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def n_steps(self) -> int:
        return int(self.rates.shape[1])

    @property
    def duration_s(self) -> float:
        return self.n_steps * self.step_s


Trace = RequestLog | RateSeries
