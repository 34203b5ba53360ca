"""The activator's event-loop choice (autoscaler/live/activator/loop.py): auto picks uvloop when installed."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from autoscaler.live.activator.loop import loop_factory, loop_name, run


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_auto_prefers_uvloop_and_asyncio_is_asyncios() -> None:
    assert loop_factory("asyncio") is None
    assert run(_loop_module(), "asyncio") == "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        assert loop_name("auto") == "asyncio" and run(_loop_module(), "auto") == "asyncio"
        with pytest.raises(ValueError, match="uvloop package is not installed"):
            loop_factory("uvloop")
    else:
        assert loop_name("auto") == "uvloop" and run(_loop_module(), "auto") == "uvloop"
        assert run(_loop_module(), "uvloop") == "uvloop"


def test_an_unknown_loop_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="event loop 'trio': expected one of auto, asyncio, uvloop"):
        loop_factory("trio")
    out = subprocess.run([sys.executable, "-m", "autoscaler.cli.main", "activator", "--loop", "trio"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--loop" in out.stderr and "trio" in out.stderr
