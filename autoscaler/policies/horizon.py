"""The receding-horizon planner's first step: what to do now so that the schedule over the lead time meets the SLO at
least cost.

Each tick slotwise's policy sizes two needs from the forecast of the lead window (cold start + tick + metric lag:
until the replicas the *next* decision asks for can be Ready):

- ``hold``: the replicas the SLO needs at the peak of the whole window, from now on;
- ``up``: the replicas it needs at the peak of the part of the window a replica asked for now can serve, from its
  cold start on (:meth:`autoscaler.estimation.forecast.FleetForecaster.lead_quantiles`).

and applies the first step of the cheapest schedule that meets both: scale up to ``up`` when fewer are in place,
scale down to ``hold`` when more are (through the scale-down rails: stabilization, the N-1 check), hold otherwise.

Why that is the optimum's first step (the planner's problem, solved by dynamic programming in
``tests/policies/test_horizon.py`` and compared with this rule on random need paths): a replica holds its GPU from
the moment it is asked for, and serves from its cold start ``c`` on.

- A replica asked for now serves only from ``c``: what the window needs before that is met, or not, by the
  replicas in place, and one started now to meet an earlier peak costs ``c`` of GPU time for nothing if the need is
  gone by then. Needs after the window are the next decision's to meet: asked for then, its replicas are ready in
  time.
- A replica removed now and needed again ``t`` from now must be asked for again at ``t - c``: holding it costs ``t``
  of GPU time, removing it and asking again costs ``c`` (its cold start), so the removal pays when ``t > c`` and
  cannot be undone in time when ``t < c`` (+ the tick until the next decision, + the metrics' lag: the window). What
  the whole window needs is held; what it does not need goes.

Per-tick sizing at the whole window's peak is this rule whenever the forecast's quantiles do not fall inside the
window (the usual case: a quantile's spread widens with the horizon). They differ where the forecast peaks in a step
that ends before the replicas could be ready (a big model's minutes-long cold start ahead of an hour's decline): then
per-tick sizing starts replicas that arrive after the peak they were started for.
"""

from __future__ import annotations


def first_step(current: int, up: int, hold: int) -> int:
    """The count to ask for now (see the module docstring): ``up`` when fewer replicas are in place, ``hold`` when
    more are, ``current`` in between. ``up`` above ``hold`` (a need that only the ready window holds; sizing floors
    can make it so) is a scale-up all the same."""
    if current < up:
        return up
    if current > hold:
        return max(hold, up)
    return current
