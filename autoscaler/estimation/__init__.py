"""Models of the world the decision core reasons with (pure, no I/O).

- :mod:`~autoscaler.estimation.capacity`: how one replica serves -- the queueing model (Erlang C with an
  Allen-Cunneen correction) shared by sizing, the oracle and the fluid simulator;
- :mod:`~autoscaler.estimation.cold_start`: the cold start learned online (the forecast's lead time);
- :mod:`~autoscaler.estimation.learning`: online estimators of the service-time scale and the sizing quantile;
- :mod:`~autoscaler.estimation.model_learning`: one model's learning, composed from those;
- :mod:`~autoscaler.estimation.forecast`: the fleet forecaster (sharded slotwise batches) answering each model's
  load quantiles over its lead time.

May import: ``autoscaler.api``, ``sharing``, ``forecasting``.
"""
