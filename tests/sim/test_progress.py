"""Progress of a simulation run without a terminal (autoscaler/sim/harness.py progress_bar): plain lines a log can
hold, every 10 % or 30 s, and a short run prints little more than its last line. The clock is injected."""

from __future__ import annotations

import io

from autoscaler.sim.harness import progress_bar


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_not_a_terminal_prints_lines_every_ten_percent() -> None:
    out, clock = io.StringIO(), Clock()
    bar, cb = progress_bar("simulating slotwise", out, clock)
    assert bar is None and cb is not None
    for k in range(0, 201):  # a long run: 200 reports, 1 s apart (10 % every 20 s)
        cb(k / 200)
        clock.t += 1.0
    got = lines(out)
    assert got[0] == "simulating slotwise: 10% (20 s)"
    assert got[-1] == "simulating slotwise: 100% (200 s)"
    assert [g.split(": ")[1].split("%")[0] for g in got] == [str(p) for p in range(10, 101, 10)]


def test_slow_progress_prints_every_thirty_seconds() -> None:
    out, clock = io.StringIO(), Clock()
    _, cb = progress_bar("simulating hpa", out, clock)
    cb(0.0)
    for _ in range(4):  # 4 reports 20 s apart, all under 10 %
        clock.t += 20.0
        cb(0.01)
    assert lines(out) == ["simulating hpa: 1% (40 s)", "simulating hpa: 1% (80 s)"]


def test_a_short_run_prints_its_last_line_only_once() -> None:
    out, clock = io.StringIO(), Clock()
    _, cb = progress_bar("simulating kpa", out, clock)
    for k in range(0, 201):  # 0.4 s in all
        cb(k / 200)
        clock.t += 0.002
    cb(1.0)  # simulate() reports the end again
    assert lines(out) == ["simulating kpa: 100% (0 s)"]
