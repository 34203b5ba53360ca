"""The activator (issue 18): an aiohttp reverse proxy in front of models at zero replicas.

- :mod:`~autoscaler.live.activator.routes`: which Service a request is for and its ready backends, built from
  EndpointSlice objects (pure);
- :mod:`~autoscaler.live.activator.holding`: the per-model bounded FIFO of held requests, Retry-After (pure);
- :mod:`~autoscaler.live.activator.watch`: the EndpointSlice informers feeding the routes;
- :mod:`~autoscaler.live.activator.notify`: the activation reports POSTed to the controllers;
- :mod:`~autoscaler.live.activator.proxy`: the aiohttp app (hold, forward, stream);
- :mod:`~autoscaler.live.activator.metrics`: its prometheus_client metrics;
- :mod:`~autoscaler.live.activator.loop`: its event loop (uvloop when installed).

The contract with the controller is docs/scale-to-zero.md. May import what ``autoscaler.live`` may.
"""
