"""``slotwise.io/slot-speeds``: every bad entry is named with the field; good entries parse in order."""

from __future__ import annotations

import pytest

from autoscaler.api.spec import PREFIX, SpecError, parse_annotations, parse_mapping


def _problem(value: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_annotations("llama", {PREFIX + "slo-latency-ms": "500", PREFIX + "slot-speeds": value}, namespace="ml")
    (p,) = info.value.problems
    assert p.key == PREFIX + "slot-speeds" and p.value == value
    return p.reason


def test_each_bad_entry_is_named_and_the_good_ones_are_not() -> None:
    reason = _problem("L4=0.4,A100=fast,T4=-1,H100")
    assert "A100: speed 'fast'" in reason and "T4: speed '-1'" in reason and "entry 'H100' is not KIND=SPEED" in reason
    assert "L4" not in reason.split(" (format")[0]
    assert "e.g. L4=0.4" in reason  # the format, with an example


def test_a_kind_given_twice_is_an_error_whatever_its_case() -> None:
    assert "l4: given twice" in _problem("L4=0.4,l4=0.5")


def test_order_and_case_are_kept() -> None:
    spec = parse_mapping("m", {"slo-latency-ms": 500, "slot-speeds": "H100-80GB/3g.40gb=0.5, l4=0.1,whole=1"})
    assert spec.slot_speeds == (("H100-80GB/3g.40gb", 0.5), ("l4", 0.1), ("whole", 1.0))


def test_one_models_bad_speeds_do_not_touch_another_model() -> None:
    good = parse_annotations("b", {PREFIX + "slo-latency-ms": "500", PREFIX + "slot-speeds": "L4=0.4"})
    with pytest.raises(SpecError) as info:
        parse_annotations("a", {PREFIX + "slo-latency-ms": "500", PREFIX + "slot-speeds": "L4=x"})
    assert info.value.model == "default/a" and good.slot_speeds == (("L4", 0.4),)


def test_replica_speed_reads_both_fields_of_the_spec() -> None:
    from autoscaler.api.spec import ModelSpec, replica_speed
    from sharing.catalog import load_catalog
    from sharing.slots import Slot

    l4 = load_catalog().get("L4")
    share = Slot.share("n", 0, l4, 8.0, 0.25)
    assert replica_speed(ModelSpec("m", gpu_compute_share=0.25), share) == pytest.approx(0.0995, abs=1e-4)
    assert replica_speed(ModelSpec("m", gpu_compute_share=0.25, slot_speeds=(("share", 0.5),)), share) == 0.5
    assert replica_speed(ModelSpec("m"), Slot.whole("n", 0, l4)) == pytest.approx(0.0995, abs=1e-4)
