"""The pure decision core: (snapshot, metrics window, controller state) -> (plan, state).

- :mod:`~autoscaler.decision.config`: ``CoreConfig`` and ``build_core``, the ONE wiring the simulator and the
  live controller share;
- :mod:`~autoscaler.decision.core`: ``decide`` -- per model learn, forecast, size (the policy inside its rails);
- :mod:`~autoscaler.decision.scaledown`: every scale-down rule in one place (which replicas go, the drain);
- :mod:`~autoscaler.decision.arbitration`: who gets GPUs when they run out, and whom to preempt;
- :mod:`~autoscaler.decision.lend`: lend idle reserved GPUs to training, reclaim them ahead of need;
- :mod:`~autoscaler.decision.node_actions`: the node-level actions placements imply (MIG layouts, time-slicing,
  slot templates);
- :mod:`~autoscaler.decision.tick`: ``plan_tick``, one tick's whole plan (decide + node-level actions).

No I/O, no clock (time is ``snapshot.now``), no Kubernetes. May import: ``autoscaler.api``,
``autoscaler.estimation``, ``autoscaler.policies``, ``sharing``, ``forecasting``.
"""
