"""The controller image: the chart's default image is the one the README says to build, and the Dockerfile's build
context carries what ``pip install .`` needs (issue 17, item 5).

No Docker daemon is assumed: the Dockerfile, its ``.dockerignore`` allow-list, pyproject.toml, the chart and the
README are read as files; the rendered Deployment comes from ``helm template``."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from realparts.helm import Helm

pytest_plugins = ("realparts.helm",)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "slotwise"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def default_image(helm: Helm) -> str:
    done = helm.run("template", "rel", str(CHART), check=True)
    (dep,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container["image"]


def test_the_charts_default_image_is_the_one_the_readme_builds(helm: Helm) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    image = f"{values['image']['repository']}:{chart['appVersion']}"
    assert values["image"]["tag"] == "" and chart["appVersion"] == VERSION  # the tag follows the package version
    assert default_image(helm) == image == f"slotwise:{VERSION}"
    readme = (REPO / "README.md").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    build = f"docker build -t {image} ."
    assert build in readme and build in dockerfile, f"README.md and the Dockerfile must say `{build}`"
    # loaded into a local cluster under that name, or pushed and the chart pointed at the registry
    for step in (f"kind load docker-image {image}", f"minikube image load {image}", "--set image.repository="):
        assert step in readme, step
    # IfNotPresent: an image loaded into the nodes (never pulled) is used as it is
    assert values["image"]["pullPolicy"] == "IfNotPresent"


def _copied(dockerfile: str) -> list[str]:
    """The sources of every COPY of the Dockerfile (build-context paths)."""
    out: list[str] = []
    for line in dockerfile.splitlines():
        if m := re.match(r"\s*COPY\s+(?!--from)(.+)$", line):
            *sources, _dest = m.group(1).split()
            out += [s.rstrip("/") for s in sources]
    return out


def _in_context(path: str, rules: list[str]) -> bool:
    """Whether ``path`` is sent to the daemon under .dockerignore ``rules`` (the last matching rule wins)."""
    keep = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            keep = negate
    return keep


def test_the_build_context_carries_what_pip_install_needs_and_nothing_else() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = _copied(dockerfile)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    # what `pip install .` reads: pyproject.toml, the readme it names, every package root (and its data)
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed |= set(project["tool"]["setuptools"]["package-data"])
    assert needed <= set(copied), f"the Dockerfile does not COPY {sorted(needed - set(copied))}"
    rules = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert all(_in_context(p, rules) for p in copied), "a COPYed path is excluded by .dockerignore"
    for heavy in (".venv", "tests", ".git", "bench", "docs", "slotwise-report", ".hypothesis"):
        assert not _in_context(heavy, rules), f"{heavy} would be sent to the Docker daemon"
    assert not _in_context("autoscaler/cli/__pycache__", rules)
    # the image runs as the chart's non-root user, `slotwise run` by default
    assert "USER 65532:65532" in dockerfile and 'ENTRYPOINT ["slotwise"]' in dockerfile
