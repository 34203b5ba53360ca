"""``slotwise activator``: the activator in front of models at zero (issue 18; docs/scale-to-zero.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

log = logging.getLogger("slotwise.activator")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("activator", help="hold requests for models at zero, forward them once a replica is Ready",
                       description=__doc__)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    p.add_argument("--controller", action="append", default=[], metavar="URL",
                   help="a controller endpoint to report activations to (repeatable)")
    p.add_argument("--controller-service", default=None, metavar="HOST:PORT",
                   help="a name resolving to every controller replica (a headless Service): each address is told")
    p.add_argument("--queue-limit", type=int, default=1000, help="held requests per model before 503")
    p.add_argument("--hold-timeout-s", type=float, default=300.0, help="a held request is answered 504 after this")
    p.add_argument("--drain-timeout-s", type=float, default=None,
                   help="on SIGTERM, how long held requests and open streams may take to finish before the process "
                        "exits anyway (default: the hold timeout + 30 s, so every held request gets its full hold)")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                   help="the event loop: uvloop when installed (auto, the default), else asyncio's")
    p.add_argument("--port", type=int, default=8012,
                   help="the proxy's first port: it listens on PORT .. PORT + --port-count - 1, the i-th serving the "
                        "Service port the controller's slice sends to activator port 8012 + i")
    p.add_argument("--port-count", type=int, default=None,
                   help="how many proxy ports (one per Service port fronted; default: the controller's 16)")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="this pod's (projected) ServiceAccount token, sent as the bearer token of the activation "
                        "reports (re-read as it rotates); the controller checks it with a TokenReview")
    p.add_argument("--admin-port", type=int, default=9090, help="/metrics, /healthz, /readyz")
    p.add_argument("--host", default="0.0.0.0", help="the address both ports listen on")
    p.add_argument("--namespace", "--namespaces", dest="namespaces", action="append", default=[],
                   help="watch EndpointSlices in this namespace only (repeatable, or comma-separated; "
                        "default: cluster-wide)")
    p.add_argument("--pod-name", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="this activator's name in its reports (default: $POD_NAME, else the host name)")
    p.set_defaults(func=main)


async def serve(args: argparse.Namespace) -> int:
    from aiohttp import web
    from kubernetes_asyncio import config as kconfig
    from kubernetes_asyncio.client import ApiClient, Configuration

    from autoscaler.cli.run import client_configuration
    from autoscaler.live.activator.metrics import ActivatorMetrics
    from autoscaler.live.activator.notify import Notifier, TokenFile
    from autoscaler.live.activator.proxy import Activator, admin_app, new_session
    from autoscaler.live.activator.routes import RouteTable
    from autoscaler.live.activator.watch import SliceWatch, slice_version
    from autoscaler.live.kube.discovery import discover
    from autoscaler.live.kube.objects import ACTIVATOR_PORT
    from autoscaler.live.kube.routing import ACTIVATOR_PORT_COUNT

    if args.in_cluster:
        cfg = Configuration()
        kconfig.load_incluster_config(client_configuration=cfg)
    else:
        cfg = await client_configuration(args.kubeconfig)
    namespaces = [n for item in args.namespaces for n in item.split(",") if n]
    metrics = ActivatorMetrics()
    table = RouteTable()
    async with ApiClient(configuration=cfg) as api, new_session() as session:
        activator = Activator(table, metrics, session, queue_limit=args.queue_limit,
                              hold_timeout_s=args.hold_timeout_s)
        notifier = Notifier(session, args.pod_name, activator.report, controllers=args.controller,
                            controller_service=args.controller_service, refused=metrics.reports_refused.inc,
                            token=TokenFile(args.token_file) if args.token_file else None)
        activator.kick = notifier.kick
        watch = SliceWatch(api, table, activator.on_change, version=slice_version(await discover(api)),
                           namespaces=namespaces)

        stopping = asyncio.Event()

        def ready() -> tuple[bool, str]:
            if stopping.is_set():
                return False, "draining: SIGTERM received"
            return (True, "ok") if watch.synced else (False, "EndpointSlice informers not synced yet")

        drain_s = args.drain_timeout_s if args.drain_timeout_s is not None else args.hold_timeout_s + 30.0
        # cleanup() closes the listener, then waits up to shutdown_timeout for the handlers in flight
        # one listener per fronted Service port: kube-proxy's destination port is all that says which one a
        # request came through (the controller's slice maps Service port i to activator port 8012 + i)
        count = args.port_count if args.port_count is not None else ACTIVATOR_PORT_COUNT
        proxies = [web.ServerRunner(activator.proxy_server(ACTIVATOR_PORT + i), shutdown_timeout=drain_s)
                   for i in range(max(1, count))]
        admin = web.AppRunner(admin_app(metrics, ready), access_log=None)
        for i, proxy in enumerate(proxies):
            await proxy.setup()
            await web.TCPSite(proxy, args.host, args.port + i, backlog=1024).start()
        await admin.setup()
        await web.TCPSite(admin, args.host, args.admin_port).start()
        log.info("activator %s: proxy on %s:%d-%d, admin on %s:%d, %s event loop", args.pod_name, args.host,
                 args.port, args.port + len(proxies) - 1, args.host, args.admin_port,
                 type(asyncio.get_running_loop()).__module__.split(".")[0])
        print(f"listening on {args.port}", flush=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        tasks = [asyncio.create_task(i.run()) for i in watch.informers] + [asyncio.create_task(notifier.run())]
        stop = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t.done():
                    t.result()  # an informer or the notifier died: raise it
            # SIGTERM (the pod is deleted; the chart's preStop sleep let kube-proxy stop sending here first):
            # /readyz fails at once, the listener closes, held requests (forwarded or timed out) and open streams
            # finish up to drain_s. The informers and the notifier keep running meanwhile: a held request is
            # released by the watch and its model woken by the reports.
            held = sum(len(q) for q in activator.queues.values())
            log.info("SIGTERM: draining (%d held requests), up to %g s", held, drain_s)
            await asyncio.gather(*(p.cleanup() for p in proxies))
            log.info("drained; exiting")
        finally:
            stop.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for proxy in proxies:
                await proxy.cleanup()
            await admin.cleanup()
    return 0


def main(args: argparse.Namespace) -> int:
    from autoscaler.live.activator.loop import loop_factory, run

    try:
        loop_factory(args.loop)
    except ValueError as e:
        print(f"slotwise activator: --loop: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(serve(args), args.loop)
    except KeyboardInterrupt:
        return 0
