"""Renderers: mig-parted config, node label, time-slicing config, pod resources; layouts always legal."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.catalog import load_catalog
from sharing.render import (
    MIG_CONFIG_LABEL,
    LayoutError,
    check_layout,
    mig_config_label,
    mig_parted_config,
    node_mig_config,
    pod_resources,
    time_slicing_config,
    to_yaml,
)
from sharing.slots import Inventory, NodeSpec, Slot

CAT = load_catalog()
MIG_KINDS = [n for n in CAT.names() if CAT.get(n).mig_capable]


def test_mig_parted_shape_and_grouping():
    g = CAT.get("H100-80GB")
    lay = [("3g", 4), ("2g", 0), ("1g", 2), ("1g", 3)]
    cfg = mig_parted_config("mixed-1", g, {0: lay, 1: lay, 2: None})
    assert cfg["version"] == "v1"
    entries = cfg["mig-configs"]["mixed-1"]
    assert entries[0] == {"devices": [0, 1], "mig-enabled": True,
                          "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
    assert entries[1] == {"devices": [2], "mig-enabled": False}
    assert list(entries[0]["mig-devices"]) == ["3g.40gb", "2g.20gb", "1g.10gb"]  # largest first
    assert yaml.safe_load(to_yaml(cfg)) == cfg
    same = mig_parted_config("all-1g", g, {i: [("1g", s) for s in range(7)] for i in range(8)})
    assert same["mig-configs"]["all-1g"] == [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]


@pytest.mark.parametrize(
    "layout,why",
    [
        ([("3g", 2)], "cannot start"),
        ([("3g", 0), ("4g", 0)], "overlaps"),
        ([("1g", i) for i in range(7)] + [("1g+me", 6)], "overlaps"),
        ([("7g", 0), ("1g", 0)], "overlaps"),
        ([("9g", 0)], "no MIG profile"),
    ],
)
def test_illegal_layouts_are_refused(layout, why):
    with pytest.raises(LayoutError, match=why):
        check_layout(CAT.get("A100-40GB"), layout)


def test_plain_gpu_has_no_mig_layout():
    with pytest.raises(LayoutError):
        check_layout(CAT.get("T4"), [("1g", 0)])


@st.composite
def legal_layout(draw):
    kind = draw(st.sampled_from(MIG_KINDS))
    gpu = CAT.get(kind)
    inv = Inventory.from_nodes([NodeSpec("n", kind, 1, mig_enabled=True)])
    d = inv.device("n", 0)
    placed = []
    for _ in range(draw(st.integers(0, 8))):
        options = [(p.key, s) for p in gpu.profiles.values() for s in p.placements if d.can_create(p, s)]
        if not options:
            break
        key, start = draw(st.sampled_from(options))
        inv.create_mig_instance("n", 0, key, start)
        d = inv.device("n", 0)
        placed.append((key, start))
    return kind, placed, inv


@settings(max_examples=60, deadline=None)
@given(legal_layout())
def test_every_inventory_layout_renders_legally(case):
    kind, placed, inv = case
    gpu = CAT.get(kind)
    cfg, labels = node_mig_config(inv, "n")
    (name,) = cfg["mig-configs"]
    assert labels == {MIG_CONFIG_LABEL: name}
    (entry,) = cfg["mig-configs"][name]
    assert entry["mig-enabled"] is True
    counts = entry.get("mig-devices", {})
    assert sum(counts.values()) == len(placed)
    names = {p.name for p in gpu.profiles.values()}
    assert set(counts) <= names
    # The rendered multiset must be re-placeable on an empty GPU of the same model.
    assert check_layout(gpu, placed) == sorted(placed, key=lambda x: x[1])
    assert yaml.safe_load(to_yaml(cfg)) == cfg


def test_label_and_time_slicing():
    assert mig_config_label("all-1g.10gb") == {"nvidia.com/mig.config": "all-1g.10gb"}
    with pytest.raises(ValueError):
        mig_config_label("bad name!")
    cfg = time_slicing_config({"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 2})
    res = cfg["sharing"]["timeSlicing"]["resources"]
    assert {"name": "nvidia.com/gpu", "replicas": 4} in res and cfg["version"] == "v1"
    assert yaml.safe_load(to_yaml(cfg)) == cfg
    with pytest.raises(ValueError):
        time_slicing_config({"nvidia.com/gpu": 0})
    with pytest.raises(ValueError):
        time_slicing_config({"amd.com/gpu": 2})


def test_pod_resources_mixed_strategy():
    h = CAT.get("H100-80GB")
    assert pod_resources(Slot.whole("n", (0, 1), h), h)["limits"] == {"nvidia.com/gpu": "2"}
    assert pod_resources(Slot.mig("n", 0, h, "3g", 4), h)["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
    assert pod_resources(Slot.share("n", 0, h, 10.0, 0.1, "2g", 0), h)["requests"] == {"nvidia.com/mig-2g.20gb": "1"}
    assert pod_resources(Slot.share("n", 0, h, 10.0, 0.1), h)["limits"] == {"nvidia.com/gpu": "1"}
