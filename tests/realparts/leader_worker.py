"""A stand-in controller process for leader-election tests: runs a :class:`LeaderElector` and logs when it acts.

Run as a subprocess::

    python tests/realparts/leader_worker.py --kubeconfig F --namespace NS --lease NAME --identity ID \\
        --log FILE --lease-duration 4 --renew-deadline 3 --retry 0.5

"Acting" is what a controller tick would see: ``is_leader`` sampled every ``--sample`` seconds (50 ms). The
worker appends ``"<identity> start <time.time()>"`` at the first True sample of a stretch and
``"<identity> stop <time.time()>"`` with the time of its LAST True sample (the last moment it acted), one
``O_APPEND`` write per line so several workers can share FILE. SIGTERM/SIGINT: stop sampling (log the stop),
then release the Lease (client-go ``ReleaseOnCancel``) and exit 0 -- a real controller also stops ticking
before giving the Lease up. The elector knows nothing of this script; ``slotwise run`` can replace it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, when run from a checkout

from kubernetes_asyncio import client, config

from autoscaler.live.kube.leader import LeaderElector


class ActingLog:
    def __init__(self, path: Path, identity: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._identity = identity

    def write(self, what: str, when: float) -> None:
        os.write(self._fd, f"{self._identity} {what} {when:.6f}\n".encode())

    def close(self) -> None:
        os.close(self._fd)


async def sample(elector: LeaderElector, out: ActingLog, interval_s: float, last_true: list[float | None]) -> None:
    """Log start/stop of acting; ``last_true[0]`` is the time of the latest True sample while acting."""
    while True:
        now = time.time()
        if elector.is_leader:
            if last_true[0] is None:
                out.write("start", now)
            last_true[0] = now
        elif last_true[0] is not None:
            out.write("stop", last_true[0])
            last_true[0] = None
        await asyncio.sleep(interval_s)


async def main(args: argparse.Namespace) -> int:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    out = ActingLog(Path(args.log), args.identity)
    async with client.ApiClient(configuration=configuration) as api:
        elector = LeaderElector(
            api,
            args.namespace,
            args.lease,
            args.identity,
            lease_duration_s=args.lease_duration,
            renew_deadline_s=args.renew_deadline,
            retry_period_s=args.retry,
        )
        running = asyncio.create_task(elector.run())
        last_true: list[float | None] = [None]
        sampler = asyncio.create_task(sample(elector, out, args.sample, last_true))
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (sampler, stopping):
            task.cancel()
        await asyncio.wait({sampler, stopping})
        if last_true[0] is not None:  # stop acting before giving the Lease up
            out.write("stop", last_true[0])
        await elector.release()
        await asyncio.wait({running})
        out.close()
        if running in done and running.exception() is not None:  # run() ended on its own: a bug
            logging.error("elector stopped unexpectedly", exc_info=running.exception())
            return 1
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--lease", required=True)
    p.add_argument("--identity", required=True)
    p.add_argument("--log", required=True, help="file to append '<identity> start|stop <time>' lines to")
    p.add_argument("--lease-duration", type=float, default=15.0)
    p.add_argument("--renew-deadline", type=float, default=10.0)
    p.add_argument("--retry", type=float, default=2.0)
    p.add_argument("--sample", type=float, default=0.05, help="is_leader sampling interval, s")
    return p.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main(parse_args())))
