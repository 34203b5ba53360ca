"""The slot-speed table (sharing/data/slot_speeds.json) and how a slot's speed follows from it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharing.catalog import DEFAULT_RELATIVE_SPEED, load_catalog
from sharing.slot_speed import REFERENCE_GPU, blend, declared_speed, gpu_speeds, slot_type, speed_of, table_speed
from sharing.slots import Slot

DATA = Path(__file__).resolve().parents[2] / "sharing" / "data" / "slot_speeds.json"
CAT = load_catalog()


def test_every_catalog_kind_has_a_sourced_row() -> None:
    table = gpu_speeds()
    assert set(table) == set(CAT.names())
    for row in table.values():
        assert row.speed > 0 and math.isfinite(row.speed)
        assert row.basis in ("reference", "blend", "mlperf", "assumed")
        assert row.source.startswith("https://"), row.name
        assert row.fp16_dense_tflops > 0 and row.memory_tbps > 0
    assert table[REFERENCE_GPU].speed == 1.0 and table[REFERENCE_GPU].basis == "reference"


def test_blends_and_measured_ratios_are_what_the_table_says() -> None:
    """Each speed is recomputed from the figures next to it, so a typo in one cannot go unnoticed."""
    table = gpu_speeds()
    ref = table[REFERENCE_GPU]
    doc = json.loads(DATA.read_text())["gpus"]
    for name, row in table.items():
        derived = blend(row.fp16_dense_tflops / ref.fp16_dense_tflops, row.memory_tbps / ref.memory_tbps)
        if row.basis in ("blend", "assumed", "reference"):
            assert row.speed == pytest.approx(derived, abs=1e-4), name
        else:  # measured: the MLPerf ratio, with the datasheet blend within 10 % of it as a check
            m = doc[name]["measured"]
            assert row.speed == pytest.approx(m["value"] / m["reference_value"], abs=1e-4), name
            assert derived == pytest.approx(row.speed, rel=0.1), name
    assert table["L4-24GB"].speed == pytest.approx(1.30094 / 13.0687, abs=1e-4)  # MLPerf v3.1 GPT-J Offline


def test_the_catalog_reads_the_same_table() -> None:
    for name, row in gpu_speeds().items():
        assert DEFAULT_RELATIVE_SPEED[name] == row.speed
        assert CAT.get(name).relative_speed == row.speed


def _mig(gpu: str, profile: str) -> Slot:
    g = CAT.get(gpu)
    return Slot.mig("n", 0, g, profile, g.profile(profile).placements[0])


def test_whole_gpus_serve_at_the_table_speed() -> None:
    assert table_speed(Slot.whole("n", 0, CAT.get("H100-80GB"))) == 1.0
    assert table_speed(Slot.whole("n", 0, CAT.get("L4"))) == gpu_speeds()["L4-24GB"].speed
    # A multi-GPU replica: the profile is for a replica on that many reference GPUs, so no n-fold speed.
    assert table_speed(Slot.whole("n", [0, 1], CAT.get("A100-80GB"))) == gpu_speeds()["A100-80GB"].speed


def test_mig_instances_get_their_share_of_compute_and_bandwidth() -> None:
    assert table_speed(_mig("H100-80GB", "3g")) == pytest.approx(math.sqrt(3 / 7 * 4 / 8))  # 0.463
    assert table_speed(_mig("H100-80GB", "1g")) == pytest.approx(math.sqrt(1 / 7 * 1 / 8))
    assert table_speed(_mig("H100-80GB", "7g")) == pytest.approx(1.0)
    a100 = gpu_speeds()["A100-80GB"].speed
    assert table_speed(_mig("A100-80GB", "4g")) == pytest.approx(a100 * math.sqrt(4 / 7 * 4 / 8))
    assert table_speed(_mig("A30-24GB", "2g")) == pytest.approx(gpu_speeds()["A30-24GB"].speed * 0.5)


def test_time_slice_shares_serve_at_their_share() -> None:
    l4 = CAT.get("L4")
    assert table_speed(Slot.share("n", 0, l4, 8.0, 0.5)) == pytest.approx(0.5 * gpu_speeds()["L4-24GB"].speed)
    h100 = CAT.get("H100-80GB")
    inside = Slot.share("n", 0, h100, 10.0, 0.2, "3g", 0)  # 0.2 of the GPU = 0.2 / (3/7) of the instance
    assert table_speed(inside) == pytest.approx(0.2 / (3 / 7) * table_speed(_mig("H100-80GB", "3g")))


@given(st.sampled_from([n for n in CAT.names() if CAT.get(n).mig_capable]), st.data())
def test_a_part_never_outruns_the_whole_and_bigger_is_not_slower(gpu: str, data: st.DataObject) -> None:
    g = CAT.get(gpu)
    whole = table_speed(Slot.whole("n", 0, g))
    profiles = list(g.profiles_by_size())
    speeds = {p.key: table_speed(_mig(gpu, p.key)) for p in profiles}
    assert all(0 < s <= whole + 1e-12 for s in speeds.values())
    a, b = data.draw(st.sampled_from(profiles)), data.draw(st.sampled_from(profiles))
    if a.compute_slices <= b.compute_slices and a.mem_slices <= b.mem_slices:
        assert speeds[a.key] <= speeds[b.key] + 1e-12
    share = data.draw(st.floats(0.01, 1.0))
    assert table_speed(Slot.share("n", 0, g, 1.0, share)) == pytest.approx(share * whole)


def test_slot_types_are_the_kind_keys_of_the_capacity_model() -> None:
    from autoscaler.estimation.model_learning import slot_kind

    slots = [Slot.whole("n", 0, CAT.get("L4")), _mig("H100-80GB", "3g"), Slot.share("n", 0, CAT.get("T4"), 4.0, 0.25),
             Slot.share("n", 0, CAT.get("A100-80GB"), 5.0, 0.1, "1g", 0)]
    for s in slots:
        assert f"{s.gpu_model}/{slot_type(s)}" == slot_kind(s)


def test_declared_speeds_follow_the_documented_precedence() -> None:
    entries = (("L4", 0.4), ("3g.40gb", 0.5), ("H100-80GB/3g.40gb", 0.6), ("whole", 0.9))
    assert declared_speed("H100-80GB/3g.40gb", entries) == 0.6  # the whole key first
    assert declared_speed("A100-80GB/3g.40gb", entries) == 0.5  # then the slot type
    assert declared_speed("L4-24GB/whole", entries) == 0.9  # the slot type beats the GPU model
    assert declared_speed("L4-24GB/share", entries) == 0.4  # the GPU model, by alias
    assert declared_speed("T4-16GB/share", entries) is None
    assert declared_speed("L4-24GB/whole", (("nvidia-l4", 0.3),)) == 0.3  # a GFD product label, any case
    assert declared_speed("L4-24GB/whole", ()) is None


def test_the_annotation_overrides_the_table() -> None:
    l4 = Slot.whole("n", 0, CAT.get("L4"))
    assert speed_of(l4) == gpu_speeds()["L4-24GB"].speed
    assert speed_of(l4, (("L4", 0.25),)) == 0.25
    assert speed_of(l4, (("A100", 0.25),)) == gpu_speeds()["L4-24GB"].speed  # another kind's entry: the table
    # An operator's catalog override of a kind's speed is the table for that cluster.
    assert speed_of(l4, catalog=CAT.with_overrides({"L4": {"relative_speed": 0.2}})) == 0.2


def test_a_fractional_model_is_served_as_declared_on_at_least_its_share_of_the_reference() -> None:
    """Its service times describe its share ``c`` of an H100: slot speed / c, never above 1 (it asked for no more)."""
    h100, l4 = CAT.get("H100-80GB"), CAT.get("L4")
    assert speed_of(Slot.share("n", 0, h100, 10.0, 0.25), compute_share=0.25) == 1.0
    assert speed_of(_mig("H100-80GB", "2g"), compute_share=0.25) == 1.0  # 0.267 of an H100 >= 0.25: capped
    assert speed_of(Slot.whole("n", 0, h100), compute_share=0.25) == 1.0
    assert speed_of(Slot.share("n", 0, l4, 8.0, 0.25), compute_share=0.25) == pytest.approx(L4_SPEED)
    assert speed_of(Slot.whole("n", 0, l4), compute_share=0.25) == pytest.approx(L4_SPEED / 0.25)
    # a 0.1 share inside a 1g.10gb instance: 0.7 of the instance's 1/7 compute and 1/8 bandwidth
    inside = Slot.share("n", 0, h100, 5.0, 0.1, "1g", 0)
    assert speed_of(inside, compute_share=0.1) == pytest.approx(0.7 * math.sqrt(1 / 7 * 1 / 8) / 0.1)
    # a whole-GPU model is not capped: a faster GPU serves it faster
    assert speed_of(Slot.whole("n", 0, CAT.get("H200"))) == gpu_speeds()["H200-141GB"].speed > 1.0
    # declared speeds are taken as they are
    assert speed_of(Slot.share("n", 0, l4, 8.0, 0.25), (("L4", 0.7),), compute_share=0.25) == 0.7


L4_SPEED = gpu_speeds()["L4-24GB"].speed
