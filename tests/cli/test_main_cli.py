"""The top level of ``slotwise``: ``--version`` from the installed package, a ``--help`` written for users.

Run as users run it: the console script the package installs (``.venv/bin/slotwise``) and ``python -m
autoscaler.cli``, in subprocesses."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from autoscaler.cli.main import VERBS, build_parser

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("slotwise")  # the console script next to this interpreter


def slotwise(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "autoscaler.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def test_version_is_the_installed_package_version() -> None:
    done = slotwise("--version")
    assert done.returncode == 0, done.stderr
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert done.stdout.strip() == f"slotwise {version('slotwise')}" == f"slotwise {project['version']}"
    module = subprocess.run([sys.executable, "-m", "autoscaler.cli", "--version"], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert module.stdout == done.stdout


def registered_verbs() -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return set(sub.choices)


def test_help_says_what_slotwise_is_lists_every_verb_and_where_to_start() -> None:
    done = slotwise("--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "SLO-driven autoscaling and GPU packing for Kubernetes inference fleets" in text
    assert set(VERBS) == registered_verbs(), "a verb without its one line in the top-level help (VERBS)"
    lines = text.splitlines()
    for verb, line in VERBS.items():  # one line each, its own
        assert any(ln.split() and ln.split()[0] == verb and line in ln for ln in lines), verb
    assert "where to start" in text and "slotwise simulate --trace azure-llm-2023" in text
    assert "slotwise <command> --help" in text and "--version" in text
    # written for users: no module docstring markup, no internal issue numbers, no argparse's brace list
    assert "``" not in text and "issue 1" not in text and "{trace," not in text
    assert max(map(len, lines)) <= 120
    # a verb's own usage line names the verb after the program, not the top-level usage
    verb = slotwise("simulate", "--help")
    assert verb.returncode == 0 and verb.stdout.startswith("usage: slotwise simulate [-h]"), verb.stdout[:200]


@pytest.mark.parametrize("args", [(), ("help-me",)])
def test_no_verb_or_an_unknown_one_exits_2_and_points_the_way(args: tuple[str, ...]) -> None:
    done = slotwise(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert "usage: slotwise" in done.stderr
    if not args:  # nothing asked: the whole help, on stderr
        assert "where to start" in done.stderr
    else:
        assert "invalid choice: 'help-me'" in done.stderr
