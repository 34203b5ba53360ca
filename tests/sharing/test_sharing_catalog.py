"""Catalog facts: MIG geometry per GPU model, names and aliases, prices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sharing.catalog import DEFAULT_PRICES, DEFAULT_RELATIVE_SPEED, load_catalog

REQUIRED = ("H100-80GB", "A100-40GB", "A100-80GB", "H200-141GB", "A30", "L4", "T4")
BUNDLED = Path(__file__).resolve().parents[2] / "sharing" / "data" / "mig_profiles.json"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "mig_profiles.json"


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def test_required_kinds_present(cat):
    for name in REQUIRED:
        assert name in cat
        cat.get(name)


def test_h100_3g_geometry(cat):
    h100 = cat.get("H100-80GB")
    p = h100.profiles["3g"]
    assert (p.name, p.compute_slices, p.mem_slices, p.placements, p.max_count) == ("3g.40gb", 3, 4, (0, 4), 2)
    assert p.memory_gib == 40.0
    assert (h100.mem_slices_total, h100.compute_slices_total, h100.memory_gib) == (8, 7, 80.0)
    assert h100.mig_capable
    assert h100.compute_fraction("3g") == pytest.approx(3 / 7)
    assert h100.profile("3g.40gb") is p
    assert h100.profile("nvidia.com/mig-3g.40gb") is p
    assert p.resource_name == "nvidia.com/mig-3g.40gb"


def test_profile_memory_is_slices_times_named_slice(cat):
    h100 = cat.get("H100-80GB")
    assert {k: p.memory_gib for k, p in h100.profiles.items()} == {
        "1g": 10.0,
        "1g+me": 10.0,
        "1g.2mem": 20.0,
        "2g": 20.0,
        "3g": 40.0,
        "4g": 40.0,
        "7g": 80.0,
    }
    a100 = cat.get("A100-40GB")
    assert a100.profiles["1g"].memory_gib == 5.0 and a100.profiles["7g"].memory_gib == 40.0


def test_rounded_names_never_exceed_the_device(cat):
    # H200 names are rounded up (1g.18gb x 8 = 144 > 141): the catalog caps at the device share.
    for name in cat.names():
        gpu = cat.get(name)
        for p in gpu.profiles.values():
            assert p.memory_gib <= gpu.memory_gib * p.mem_slices / gpu.mem_slices_total + 1e-9
    h200 = cat.get("H200")
    assert 2 * h200.profiles["3g"].memory_gib <= h200.memory_gib
    assert h200.profiles["7g"].memory_gib == 141.0


def test_a30_layout(cat):
    a30 = cat.get("A30")
    assert a30.name == "A30-24GB"
    assert (a30.mem_slices_total, a30.compute_slices_total, a30.memory_gib) == (4, 4, 24.0)
    assert a30.profiles["1g"].placements == (0, 1, 2, 3)
    assert a30.profiles["2g"].placements == (0, 2)
    assert a30.profiles["4g"].placements == (0,)
    assert [p.name for p in a30.profiles_by_size()] == ["1g.6gb", "2g.12gb", "4g.24gb"]
    assert "3g" not in a30.profiles


def test_placement_matters_3g_at_4_leaves_four_1g(cat):
    from sharing.slots import Inventory, NodeSpec, Slot

    h100 = cat.get("H100-80GB")

    def ones_after(start: int) -> int:
        inv = Inventory.from_nodes([NodeSpec("n", "H100-80GB", 1, mig_enabled=True)])
        inv.allocate(Slot.mig("n", 0, h100, "3g", start), "big")
        n = 0
        for s in range(8):
            slot = Slot.mig("n", 0, h100, "1g", s) if s in h100.profiles["1g"].placements else None
            if slot is not None and inv.fits(slot):
                inv.allocate(slot, f"small{s}")
                n += 1
        return n

    assert ones_after(4) == 4  # slices 0-3 free for four 1g
    assert ones_after(0) == 3  # slice 7 cannot host a plain 1g


def test_non_mig_kinds(cat):
    for alias, name, mem in [
        ("T4", "T4-16GB", 16.0),
        ("L4", "L4-24GB", 24.0),
        ("A10", "A10-24GB", 24.0),
        ("V100M32", "V100-32GB", 32.0),
        ("V100M16", "V100-16GB", 16.0),
        ("P100", "P100-16GB", 16.0),
        ("G2", "G2", 32.0),
        ("G3", "G3", 32.0),
    ]:
        g = cat.get(alias)
        assert (g.name, g.memory_gib, g.mig_capable) == (name, mem, False)
        assert g.mem_slices_total == 0 and g.compute_slices_total == 0 and not g.profiles


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("H100", "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
        ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
        ("NVIDIA-H200", "H200-141GB"),
        ("Tesla-T4", "T4-16GB"),
        ("Tesla-T4-SHARED", "T4-16GB"),
        ("Tesla-V100-SXM2-32GB", "V100-32GB"),
        ("NVIDIA-L4", "L4-24GB"),
        ("NVIDIA-A30", "A30-24GB"),
        ("GH200", "H100-96GB"),
        ("h100-80gb", "H100-80GB"),
    ],
)
def test_aliases_and_gfd_labels(cat, label, name):
    assert cat.get(label).name == name


def test_unknown_kind_names_it(cat):
    with pytest.raises(KeyError, match="MI300X"):
        cat.get("MI300X")
    assert "MI300X" not in cat


def test_prices_and_speeds_documented_for_every_kind(cat):
    for name in cat.names():
        g = cat.get(name)
        assert g.price_per_hour == DEFAULT_PRICES[name] > 0
        assert g.relative_speed == DEFAULT_RELATIVE_SPEED[name] > 0
    assert cat.get("H100-80GB").relative_speed == 1.0


def test_with_prices_and_overrides(cat):
    c2 = cat.with_prices({"H100": 9.5, "T4": 0.1})
    assert c2.get("H100-80GB").price_per_hour == 9.5 and c2.get("T4").price_per_hour == 0.1
    assert cat.get("H100-80GB").price_per_hour == DEFAULT_PRICES["H100-80GB"]  # original untouched
    assert c2.get("NVIDIA-H100-80GB-HBM3").name == "H100-80GB"  # aliases kept
    c3 = cat.with_overrides({"L4": {"relative_speed": 0.2}})
    assert c3.get("L4").relative_speed == 0.2
    with pytest.raises(ValueError, match="memory_gib"):
        cat.with_overrides({"L4": {"memory_gib": 48}})
    with pytest.raises(KeyError):
        cat.with_prices({"nope": 1.0})


def test_load_from_path_matches_default(cat):
    c = load_catalog(str(BUNDLED))
    assert c.names() == cat.names()
    assert c.get("A30").profiles == cat.get("A30").profiles


@pytest.mark.skipif(not SHARED.exists(), reason="shared data folder not present")
def test_bundled_copy_matches_shared_file():
    assert json.loads(BUNDLED.read_text()) == json.loads(SHARED.read_text())


def test_sharing_imports_only_numpy_and_stdlib():
    code = (
        "import sys, sharing, sharing.catalog, sharing.slots, sharing.packer, sharing.cluster\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('autoscaler', 'forecasting', 'kubernetes', 'kubernetes_asyncio', 'aiohttp', 'yaml', 'sklearn')]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
