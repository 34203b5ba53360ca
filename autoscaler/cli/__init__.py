"""The ``slotwise`` command line: :mod:`~autoscaler.cli.main` dispatches, one module per verb
(``simulate``, ``run``, ``report``, ``trace``, ``backtest``, ``pack-bench``, ``mig-bench``).

Parses arguments and files, calls the layers below, prints. Bad input prints one line naming the file and
field and exits 2. May import anything in ``autoscaler``; nothing imports it (the bench scripts use
``autoscaler.sim.harness`` and ``autoscaler.benchmarks``).
"""
