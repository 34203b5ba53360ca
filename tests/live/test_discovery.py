"""API discovery against the real kube-apiserver (1.20.2): what it serves, and what it does not, read as such."""

from __future__ import annotations

import pytest
from realparts.kueue import kueue_installed

from autoscaler.live.kube.discovery import (
    ASSUMED,
    AUTOSCALING,
    COORDINATION,
    KUEUE,
    POLICY,
    RESOURCE,
    ServedApis,
    collection_path,
    discover,
    parse_group_list,
)

pytest_plugins = ("realparts.kube",)


@pytest.mark.asyncio
async def test_a_1_20_server_serves_policy_v1beta1_autoscaling_v2beta2_and_no_dra(api) -> None:
    apis = await discover(api)
    assert apis.discovered
    assert apis.pick(POLICY) == "v1beta1"  # policy/v1 (Eviction, PDB) is 1.21+
    assert apis.pick(AUTOSCALING) == "v2beta2"  # autoscaling/v2 is 1.23+
    assert apis.pick(COORDINATION) == "v1"
    assert apis.pick(RESOURCE) is None  # DRA: resource.k8s.io/v1 is 1.34+
    assert apis.group_version(COORDINATION) == "coordination.k8s.io/v1"


@pytest.mark.asyncio
async def test_an_installed_crd_group_is_discovered_in_its_preferred_version(api) -> None:
    assert (await discover(api)).pick(KUEUE) is None
    async with kueue_installed(api):
        assert (await discover(api)).pick(KUEUE) == "v1beta2"


@pytest.mark.asyncio
async def test_discovery_that_fails_assumes_builtins_and_no_add_ons() -> None:
    class Broken:
        def sanitize_for_serialization(self, obj):  # pragma: no cover - never reached
            return obj

        async def call_api(self, *a, **k):
            raise OSError("connection refused")

    got = await discover(Broken())
    assert got is ASSUMED and not got.discovered
    assert got.pick(POLICY) == "v1" and got.pick(KUEUE) is None and got.pick(RESOURCE) is None


def test_preferred_version_first_and_paths() -> None:
    apis = parse_group_list({"versions": ["v1"]}, {"groups": [
        {"name": "resource.k8s.io", "versions": [{"version": "v1beta1"}, {"version": "v1"}],
         "preferredVersion": {"version": "v1"}}]})
    assert apis.groups["resource.k8s.io"] == ("v1", "v1beta1")
    assert apis.pick(RESOURCE) == "v1"
    assert ServedApis({"resource.k8s.io": ("v1beta1",)}).pick(RESOURCE) == "v1beta1"
    assert collection_path("", "v1", "pods") == "/api/v1/pods"
    assert collection_path("apps", "v1", "statefulsets", "ns") == "/apis/apps/v1/namespaces/ns/statefulsets"
