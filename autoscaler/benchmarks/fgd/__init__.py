"""The FGD paper's evaluation protocol (Weng et al., ATC'23), reproduced on compact numpy state.

``workload`` (cluster, pods, target shapes, tuning), ``replay`` (the original simulator's arrival
and tie-break orders), ``sim`` (the one-pod-at-a-time simulation), ``policies`` (the baselines and
FGD), ``slotwise`` (our policy), ``metrics`` (allocation binned by arrival %, as published).
"""
