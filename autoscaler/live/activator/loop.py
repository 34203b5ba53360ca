"""Which event loop the activator runs on: uvloop when it is installed (``auto``), else asyncio's own.

The activator is the one hot path of slotwise (every request to a model that may go to zero passes through it),
and its cost per request is mostly the event loop's: parsing, the transports, the scheduling. uvloop (libuv under
the same asyncio API, what aiohttp recommends for speed) cuts that; docs/benchmarks.md measures both side by side
(``bench/activator_latency.py --loops asyncio,uvloop``). Nothing else in slotwise needs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

LOOPS = ("auto", "asyncio", "uvloop")
T = TypeVar("T")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for ``name`` (None: asyncio's default). ``uvloop`` not installed -> a clear error; ``auto``
    then falls back to asyncio."""
    if name not in LOOPS:
        raise ValueError(f"event loop {name!r}: expected one of {', '.join(LOOPS)}")
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise ValueError("event loop 'uvloop': the uvloop package is not installed (pip install uvloop)") \
                from None
        return None
    return uvloop.new_event_loop


def loop_name(name: str) -> str:
    """What ``name`` runs on here: ``uvloop`` or ``asyncio``."""
    return "asyncio" if loop_factory(name) is None else "uvloop"


def run(main: Coroutine[Any, Any, T], loop: str = "auto") -> T:
    """``asyncio.run`` on the chosen loop (``asyncio.Runner``: Python 3.11 has no ``loop_factory`` on ``run``)."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(main)
