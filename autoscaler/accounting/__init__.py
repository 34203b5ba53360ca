"""Cost accounting, pure: the unit (GPU-equivalents), the price table, who holds which GPUs and what is idle
reserved (:mod:`~autoscaler.accounting.cost`).

Below both loops: the simulator's scorecard and the live controller's cost counters
(:mod:`autoscaler.live.cost_metrics`) attribute with it, and the report reads what they recorded. May import:
``autoscaler.api``, ``sharing``.
"""
