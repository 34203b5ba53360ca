"""The data that crosses the seams (Kueue's ``apis/``): what the decision core is given and what it returns.

- :mod:`~autoscaler.api.spec`: a model's declared SLO and resources (``slotwise.io/*`` annotations, parsed here once);
- :mod:`~autoscaler.api.snapshot`: the cluster at ``now`` and the metrics window;
- :mod:`~autoscaler.api.plan`: the typed actions of a tick and every reason enum;
- :mod:`~autoscaler.api.ports`: the protocols the simulated and the live adapters implement.

Plain dataclasses and enums, no behaviour beyond parsing and validation. May import: ``sharing``, the
standard library, numpy. Never the rest of ``autoscaler``.
"""
