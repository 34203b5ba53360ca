"""slotwise: SLO-driven autoscaling and GPU packing for Kubernetes inference fleets.

The packages of ``autoscaler/``, one per role (each package docstring says what it owns and what it may import):

======================  ===============================================================================
``api/``                the data at the seams: model specs, snapshots, metrics windows, plans, ports
``policies/``           the sizing policies (slotwise's and the baselines), pure
``estimation/``         models of the world: queueing capacity, what is learned online, load forecasts
``decision/``           the pure decision core: decide, scale-down, arbitration, lending, node-level actions
``sim/``                the simulated cluster, metrics and traffic engines, and the simulated control loop
``live/``               the live adapters: Kubernetes, Prometheus, the controller loop, /metrics
``accounting/``         cost attribution (pure): GPU-equivalents, prices, idle reserved
``report/``             the PoC report and the scenario scorecard
``cli/``                the ``slotwise`` command line, one module per verb
``benchmarks/``         benchmark-only code (FGD replay, MIG bounds, the forecasting backtest), never on the live path
======================  ===============================================================================

Imports point down this list's layers: ``api`` imports only ``sharing``; ``accounting``, ``estimation`` and
``policies`` import ``api``; ``decision`` imports those; ``sim`` imports ``decision`` and ``accounting``; ``report``
reads ``sim``'s results; ``live`` imports ``decision``, ``accounting`` and ``report``'s data types; ``cli`` and
``benchmarks`` sit on top. ``sharing/`` and ``forecasting/`` never import ``autoscaler`` (tests/test_layers.py).
"""
