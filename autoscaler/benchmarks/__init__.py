"""Benchmark-only code: what the benchmark verbs of the CLI (``pack-bench``, ``mig-bench``, ``backtest``,
``frontier``) and the scripts in ``bench/`` run, and nothing on the live path imports.

- :mod:`~autoscaler.benchmarks.fgd`: the FGD paper's evaluation protocol (its own compact cluster state, replayed
  orders, the published baselines, slotwise's placement policy in that protocol);
- :mod:`~autoscaler.benchmarks.mig`: MIG packing scenarios, exact MILP / LP lower bounds (scipy HiGHS), the
  minimum-move re-layout they also measure;
- :mod:`~autoscaler.benchmarks.backtest`: the forecasting evaluation protocol and its baselines (naive, seasonal
  naive, ETS, the global GBM, statsforecast's AutoETS / MSTL);
- :mod:`~autoscaler.benchmarks.frontier`: slotwise against the GPU-hours-vs-violating-requests curves of the
  baselines swept over target utilisation (issue 15's first target).

May import anything in ``autoscaler``, ``sharing``, ``forecasting``; the product packages never import it.
"""
