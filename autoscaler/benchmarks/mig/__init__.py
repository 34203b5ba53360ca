"""MIG packing benchmark (``slotwise mig-bench``): scenarios, exact MILP / LP-relaxation lower bounds on GPUs or
cost (scipy HiGHS), and ``relayout`` -- the next placement with the fewest moves -- which the benchmark measures.
Not on the live path: the controller re-partitions through :mod:`autoscaler.decision.node_actions`."""
