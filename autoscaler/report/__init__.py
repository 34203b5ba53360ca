"""The PoC report (``slotwise report``): cost per team and model, idle reserved cost, lent value, waiting,
SLO attainment and fragmentation, from a simulation's JSON or from Prometheus history.

- :mod:`autoscaler.report.data`: the numbers (:class:`Section`, one per simulated policy or one per Prometheus
  range) and how a simulation JSON becomes them;
- :mod:`autoscaler.report.prometheus`: the same numbers from the exported counters over a time range;
- :mod:`autoscaler.report.render`: the terminal tables (rich), ``report.json``, ``report.png`` (matplotlib)
  and a self-contained ``report.html``;
- :mod:`autoscaler.report.scenario`: the scenario scorecard of ``slotwise simulate --scenario`` (per team and
  overall, per arbitration mode, recovery after failures): tables, ``scorecard.json``, ``report.html``, ``report.png``.

It reads finished runs; the attribution it reports is :mod:`autoscaler.accounting.cost`. May import: ``api``,
``accounting``, ``estimation``, ``policies``, ``decision``, ``sim`` (its scorecard), ``sharing``. Never ``live``
(the Prometheus readings come in as data from :mod:`autoscaler.live.prometheus.report`) or ``cli``.
"""

from autoscaler.report.data import ModelRow, Section, TeamRow, load_simulation, sections_from_simulation

__all__ = ["ModelRow", "Section", "TeamRow", "load_simulation", "sections_from_simulation"]
