"""The receding-horizon first step (autoscaler/policies/horizon.py) against the planner's problem solved exactly.

The problem: per tick ``t`` a need ``r[t]``; a replica asked for at ``t`` holds its GPU from ``t`` and serves from
``t + c`` (its cold start, in ticks); a removal is immediate; the cost is the GPU-ticks held. Every tick from the
cold start on must have ``r[t]`` replicas serving; before it, what is in place may not go below the need (more cannot
come in time). A brute-force dynamic program over every schedule gives the optimal counts to ask for now; the rule,
given the needs the policy sizes (``up``: from the cold start to the end of the lead window, ``hold``: the whole
window, which ends one tick after the cold start), must be one of them.
"""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.policies.horizon import first_step


def optimal_first_counts(need: tuple[int, ...], current: int, cold: int) -> set[int]:
    """The counts (serving + starting) that some least-cost schedule asks for at tick 0."""
    top = max([current, *need])

    @cache
    def best(t: int, ready: int, pipeline: tuple[int, ...]) -> int:
        # pipeline: the asks made at ticks t - cold .. t - 1 (the first arrives now)
        if t == len(need):
            return 0
        ready += pipeline[0]
        floor = need[t] if t >= cold else min(need[t], current)
        cost = 10**9
        for keep in range(floor, ready + 1):
            for ask in range(top + 1):
                starting = sum(pipeline[1:]) + ask
                cost = min(cost, keep + starting + best(t + 1, keep, (*pipeline[1:], ask)))
        return cost

    start = (0,) * cold
    costs: dict[int, int] = {}
    floor = need[0] if cold == 0 else min(need[0], current)
    for keep in range(floor, current + 1):
        for ask in range(top + 1):
            total = keep + ask + best(1, keep, (*start[1:], ask))
            count = keep + ask
            costs[count] = min(costs.get(count, 10**9), total)
    least = min(costs.values())
    return {count for count, cost in costs.items() if cost == least}


@settings(max_examples=300, deadline=None)
@given(
    cold=st.integers(1, 3),
    current=st.integers(0, 4),
    data=st.data(),
)
def test_the_first_step_is_the_optimal_schedules_first_step(cold: int, current: int, data: st.DataObject) -> None:
    length = data.draw(st.integers(cold + 1, cold + 3), label="ticks")
    need = tuple(data.draw(st.lists(st.integers(0, 4), min_size=length, max_size=length), label="need"))
    window = need[: cold + 1]  # the lead window: until the next decision's replicas can serve
    up, hold = window[cold], max(window)
    assert first_step(current, up, hold) in optimal_first_counts(need, current, cold)


def test_a_peak_before_the_cold_start_starts_no_replica() -> None:
    # the per-tick rule (size for the whole window's peak) would ask for 4 that arrive after the peak is gone
    need = (1, 4, 1, 1)
    assert optimal_first_counts(need, current=1, cold=2) == {1}
    assert first_step(1, up=need[2], hold=max(need[:3])) == 1


def test_what_the_window_needs_is_held_and_what_it_does_not_goes() -> None:
    assert first_step(5, up=2, hold=4) == 4  # the window's peak is held ...
    assert first_step(3, up=2, hold=4) == 3  # ... what is in place meets it until new ones could serve
    assert first_step(1, up=2, hold=4) == 2  # from the cold start on: what is needed then
    assert first_step(5, up=6, hold=4) == 6  # a floor only the ready window holds is a scale-up all the same
