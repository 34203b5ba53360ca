"""The simulator: the decision core's loop on a simulated cluster driven by real traces (the demo, the benchmark
harness and the what-if tool).

- :mod:`~autoscaler.sim.run`: ``simulate`` -- the tick loop (advance cluster -> snapshot + window -> plan -> apply ->
  serve the tick's traffic -> record);
- :mod:`~autoscaler.sim.cluster`, :mod:`~autoscaler.sim.metrics`: the simulated adapters (cluster + actuator, metrics
  source) behind the synchronous ports of :mod:`autoscaler.api.ports`; :mod:`~autoscaler.sim.lending`: what the
  cluster records about lending (training runs, reclaims, totals);
- :mod:`~autoscaler.sim.queueing`, :mod:`~autoscaler.sim.fluid`, :mod:`~autoscaler.sim.des`,
  :mod:`~autoscaler.sim.engines`: the serving engines (their interface and workload, fluid M/G/c per replica,
  request-level discrete events);
- :mod:`~autoscaler.sim.workload`, :mod:`~autoscaler.sim.defaults`, :mod:`~autoscaler.sim.training`,
  :mod:`~autoscaler.sim.scenario`: what is simulated (traces + model specs, the training backlog, scenario files);
- :mod:`~autoscaler.sim.scorecard`, :mod:`~autoscaler.sim.plot`: a run's numbers and its picture;
- :mod:`~autoscaler.sim.harness`: runs set up as the CLI and ``bench/`` do (default cluster, policies side by side).

May import: ``api``, ``accounting`` (cost units), ``estimation``, ``policies``, ``decision``, ``sharing``,
``forecasting``.
Never ``live`` (no Kubernetes, no aiohttp) or ``cli``.
"""
