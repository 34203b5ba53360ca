"""``slotwise frontier``: issue 15's first target, measured. On each trace, ``hpa``, ``kpa`` and ``predictive``
are swept over ``target_utilization``; each sweep's lower convex frontier of (GPU-hours, violating requests) is the
baseline's curve, and slotwise's point at its defaults must lie below each curve by the issue's margin (at equal
violations >= 25 % fewer GPU-hours, or at equal GPU-hours at most 1/3 of the violating requests). Also checked:
slotwise at defaults against HPA at defaults, and >= 99.5 % of requests in SLO-meeting model-minutes at <= 1.25x
the lower bound.

- :mod:`.compare`: the curve and the comparisons, pure functions of the points (unit-tested with hand-built curves);
- :mod:`.sweep`: the cases (bundled traces, hours), the runs (as ``slotwise simulate`` runs them) and the result.
"""
