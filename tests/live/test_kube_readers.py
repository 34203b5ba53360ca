"""The small pure readers the translation is built from: single fields (``autoscaler.live.kube.fields``), what a
pod asks for (``gpu_nodes.pod_gpu_requests``) and label selectors (``autoscaler.live.kube.selector``)."""

from __future__ import annotations

import pytest

from autoscaler.live.kube.fields import parse_time
from autoscaler.live.kube.gpu_nodes import pod_gpu_requests
from autoscaler.live.kube.selector import Selector, SelectorError, selector_matches

T0 = "2024-05-01T12:00:00Z"
T0_EPOCH = 1714564800.0


# -- fields and requests ----------------------------------------------------------------------------------------------
def test_parse_time_reads_rfc3339() -> None:
    assert parse_time(T0) == T0_EPOCH
    assert parse_time("2024-05-01T12:00:00.250000Z") == T0_EPOCH + 0.25
    assert parse_time("2024-05-01T14:00:00+02:00") == T0_EPOCH
    assert parse_time("2024-05-01T12:00:00") == T0_EPOCH  # naive: UTC, never local time
    assert parse_time("yesterday") is None
    assert parse_time(None) is None


def test_pod_gpu_requests_sums_containers_and_takes_init_max() -> None:
    spec = {
        "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}},
            {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1000m"}}},
            {"name": "d"},
        ],
    }
    assert pod_gpu_requests(spec) == {"nvidia.com/gpu": 3, "nvidia.com/mig-1g.10gb": 1}
    assert pod_gpu_requests({"containers": [{"name": "cpu", "resources": {"limits": {"cpu": "1"}}}]}) == {}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "y"}, True),
        ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
        ({"matchLabels": {"app": "a", "tier": "gpu"}}, {"app": "a"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}, {"app": "b"}, True),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "track", "operator": "NotIn", "values": ["canary"]}]}, {}, True),
        ({"matchExpressions": [{"key": "track", "operator": "NotIn", "values": ["canary"]}]},
         {"track": "canary"}, False),
        ({"matchExpressions": [{"key": "track", "operator": "Exists"}]}, {"track": ""}, True),
        ({"matchExpressions": [{"key": "track", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "track", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "track", "operator": "DoesNotExist"}]}, {"track": "x"}, False),
        ({"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "track", "operator": "DoesNotExist"}]},
         {"app": "a", "track": "x"}, False),
        ({}, {"app": "a"}, False),  # an empty selector selects nothing here (apps/v1 rejects it anyway)
        (None, {"app": "a"}, False),
    ],
)
def test_selector_semantics(selector, labels, expected) -> None:
    assert selector_matches(selector, labels) is expected


def test_selector_rejects_unknown_operator_and_bad_values() -> None:
    with pytest.raises(SelectorError, match="unknown operator"):
        Selector.compile({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]})
    with pytest.raises(SelectorError, match="needs values"):
        Selector.compile({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]})
    with pytest.raises(SelectorError, match="takes no values"):
        Selector.compile({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})
