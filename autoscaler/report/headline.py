"""The headline ``slotwise simulate`` prints before its table: the GPU-hours each policy needs at its SLO and what
slotwise saves (or loses) against each.

A policy **meets the SLO objective** when its headline ``slo_attainment`` (requests in SLO-meeting model-minutes,
docs/scorecard.md) is at least :data:`SLO_OBJECTIVE`. "GPU-hours at its SLO" only means something for a policy
that meets it: a policy that misses is said to miss ("misses its SLO: 94.1%"), and slotwise's GPU-hours against
it are a fact about two runs, never called a saving. Every number is one of the scorecard's fields (the table's),
so the headline cannot contradict the table; attainment is shown rounded *down*, so a miss never prints as 99.5%.

:func:`headline` is pure: scorecards in, lines out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.sim.harness import POLICY_ORDER

SLO_OBJECTIVE = 0.995  # requests in SLO-meeting model-minutes (issue 15's target)
REFERENCE = "oracle"  # the per-tick, zero-cold-start oracle: a reference to read against, not a policy to run
SUBJECT = "slotwise"
DEFAULTS_BASELINE = "hpa"
_SAME = 0.005  # relative GPU-hour differences under 0.5 % are "the same"

Card = Mapping[str, Any]


def meets_objective(card: Card) -> bool:
    return float(card.get("slo_attainment", 0.0)) >= SLO_OBJECTIVE - 1e-12


def attainment_pct(x: float) -> str:
    """``x`` (a share) as a percentage to 0.1 %, as the table's 4 decimals read -- except that it never crosses a
    line the number does not: a miss of the objective never prints as 99.5 % and less than all never as 100 %
    (more decimals, rounded down, there)."""
    shown = round(x * 100.0, 1)
    crosses = (x < SLO_OBJECTIVE - 1e-12 and shown >= SLO_OBJECTIVE * 100.0) or (x < 1.0 and shown >= 100.0)
    if not crosses:
        return "100%" if shown >= 100.0 else f"{shown:.1f}%"
    down = math.floor(round(x * 10000.0, 6)) / 100.0
    if x < SLO_OBJECTIVE and down >= SLO_OBJECTIVE * 100.0:
        return f"<{SLO_OBJECTIVE:.1%}"
    return f"{down:.2f}%"


def change_pct(x: float) -> str:
    """A relative change ``x`` > 0 (0.23 = 23 %): whole percent, a decimal under 1 %, never "100%" for less."""
    v = x * 100.0
    if v < 0.1:
        return "<0.1%"
    if v < 1.0:
        return f"{v:.1f}%"
    if 99.0 < v < 100.0:
        return "99%"  # 99.6 % fewer is not "100% fewer" (that would be none)
    return f"{round(v):.0f}%"


def gpu_hours(h: float) -> str:
    return f"{h:,.1f}" if h >= 100 else f"{h:.2f}"


def compare_gpu_hours(mine: float, theirs: float, name: str, verb: str = "uses") -> tuple[str, int]:
    """"uses 23% fewer GPU-hours than hpa" and the direction: -1 fewer, 0 the same, 1 more."""
    if theirs <= 0.0:
        if mine <= 0.0:
            return f"{verb} no GPU-hours, as {name}", 0
        return f"{verb} {gpu_hours(mine)} GPU-hours where {name} {verb} none", 1
    r = mine / theirs
    if abs(r - 1.0) < _SAME:
        return f"{verb} the same GPU-hours as {name}", 0
    if r < 1.0:
        return f"{verb} {change_pct(1.0 - r)} fewer GPU-hours than {name}", -1
    if r < 2.0:
        return f"{verb} {change_pct(r - 1.0)} MORE GPU-hours than {name}", 1
    return f"{verb} {r:.1f}x the GPU-hours of {name}", 1


def compare_violations(mine: int, theirs: int, name: str) -> tuple[str, int]:
    """"80% fewer violating requests" and the direction: -1 fewer, 0 the same, 1 more (counts are whole)."""
    if mine == theirs:
        return ("no violating requests either" if mine == 0 else f"as many violating requests ({mine:,})"), 0
    if theirs == 0:
        return f"{mine:,} violating requests where {name} has none", 1
    if mine == 0:
        return f"no violating requests ({name} has {theirs:,})", -1
    r = mine / theirs
    if r < 1.0:
        return f"{change_pct(1.0 - r)} fewer violating requests", -1
    if r < 2.0:
        return f"{change_pct(r - 1.0)} MORE violating requests", 1
    return f"{r:.1f}x as many violating requests", 1


def comparison(mine: Card, theirs: Card) -> tuple[str, int, int]:
    """One sentence: slotwise's GPU-hours and violating requests against another policy's, a loss said as one;
    and the two directions (GPU-hours, violating requests: -1 fewer, 0 the same, 1 more)."""
    name = str(theirs["policy"])
    gpu, g = compare_gpu_hours(float(mine["gpu_hours"]), float(theirs["gpu_hours"]), name)
    viol, v = compare_violations(int(mine["violating_requests"]), int(theirs["violating_requests"]), name)
    if g > 0 and v < 0:
        joint = ", with"  # pays GPU-hours for fewer violations
    elif g < 0 and v > 0:
        joint = " but has"  # saves GPU-hours at the price of violations
    else:
        joint = " and has"
    return f"{mine['policy']} {gpu}{joint} {viol}", g, v


def _ordered(cards: Sequence[Card]) -> list[Card]:
    rank = {p: i for i, p in enumerate(POLICY_ORDER)}
    return sorted(cards, key=lambda c: rank.get(str(c["policy"]), len(rank)))  # stable: others keep their order


def _status(card: Card) -> str:
    return "meets its SLO" if meets_objective(card) else "misses its SLO"


def policy_lines(cards: Sequence[Card]) -> list[str]:
    """One row per policy (POLICY_ORDER): GPU-hours, SLO attainment, violating requests, whether it meets the
    objective, and slotwise's comparison with it."""
    ordered = _ordered(cards)
    me = next((c for c in ordered if c["policy"] == SUBJECT), None)
    attainable = any(int(c.get("unattainable_requests") or 0) > 0 for c in ordered)
    w = max(len(str(c["policy"])) for c in ordered)
    viol_w = max(len("violating"), *(len(f"{int(c['violating_requests']):,}") for c in ordered))
    gpu_w = max(len("GPU-h"), *(len(gpu_hours(float(c["gpu_hours"]))) for c in ordered))
    head = f"  {'policy':<{w}}  {'GPU-h':>{gpu_w}}  {'in SLO':>6}  {'violating':>{viol_w}}"
    rows = [head + ("  (attainable)" if attainable else "")]
    for c in ordered:
        row = (f"  {c['policy']!s:<{w}}  {gpu_hours(float(c['gpu_hours'])):>{gpu_w}}  "
               f"{attainment_pct(float(c['slo_attainment'])):>6}  {int(c['violating_requests']):>{viol_w},}")
        if attainable:
            att = c.get("slo_attainment_attainable")
            row += f"  ({attainment_pct(float(att)) if att is not None else '-'})"
        words = [_status(c)]
        if c["policy"] == REFERENCE:
            words.insert(0, "a reference (per-tick, zero cold start; not a bound)")
        if me is not None and c is not me:
            words.append(comparison(me, c)[0])
        rows.append(f"{row}  {'; '.join(words)}")
    return rows


def at_slo_line(cards: Sequence[Card]) -> str:
    """The honest "needs at its SLO": GPU-hours compared only among the runnable policies that meet the objective."""
    ordered = [c for c in _ordered(cards) if c["policy"] != REFERENCE]
    me = next((c for c in ordered if c["policy"] == SUBJECT), None)
    meeting = [c for c in ordered if meets_objective(c)]
    names = ", ".join(str(c["policy"]) for c in meeting)
    if me is None:
        return f"at the SLO: {names or 'no policy'} meets the objective"
    if not meets_objective(me):
        if not meeting:
            return ("at the SLO: no policy meets the objective in this run, so none has GPU-hours at its SLO; "
                    "the rows compare the runs as they are")
        return (f"at the SLO: {SUBJECT} misses the objective ({attainment_pct(float(me['slo_attainment']))}); "
                f"meeting it: {names}")
    others = [c for c in meeting if c is not me]
    if not others:
        return f"at the SLO: {SUBJECT} is the only policy that meets the objective"
    parts = [compare_gpu_hours(float(me["gpu_hours"]), float(c["gpu_hours"]), str(c["policy"]), "needs")[0]
             for c in others]
    parts[1:] = [p.removeprefix("needs ") for p in parts[1:]]  # one verb: "needs 10% fewer ... than hpa, 26% ..."
    said = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"at the SLO ({names} meet it): {SUBJECT} {said}"


def lower_bound_lines(cards: Sequence[Card]) -> list[str]:
    """The clairvoyant lower bound, where the scorecards carry one, and the requests no schedule can serve."""
    me = next((c for c in cards if c["policy"] == SUBJECT), cards[0])
    out = []
    bound = me.get("lower_bound_gpu_hours")
    exempt = me.get("cold_start_slo") == "exempt"
    if bound is not None:
        line = f"lower bound (clairvoyant, with cold start): {gpu_hours(float(bound))} GPU-h"
        vs = me.get("gpu_hours_vs_lower_bound")
        if exempt:  # the bound judges cold-started requests; with them exempt it bounds nothing (scorecard.md)
            line += "; not comparable: cold-started requests are exempt from the SLO here, the bound counts them"
        elif vs is not None:
            line += f"; {me['policy']} at {float(vs):.2f}x"
        out.append(line)
    unattainable = int(me.get("unattainable_requests") or 0)
    if unattainable:
        share = unattainable / max(int(me.get("requests") or 0), 1)
        out.append(f"{unattainable:,} requests ({change_pct(share)}) are in model-minutes no schedule can meet; "
                   f"'(attainable)' is the SLO attainment over the others")
    return out


def cold_start_lines(cards: Sequence[Card]) -> list[str]:
    """Scale to and from zero (issue 18): how cold-started requests were judged, where there are any or they are
    exempt, and each policy's count and warm idle GPU-hours."""
    if not any(c.get("cold_started_requests") or c.get("cold_start_slo") == "exempt" for c in cards):
        return []
    how = ("EXEMPT from the SLO accounting (left out of SLO attainment and violating requests)"
           if any(c.get("cold_start_slo") == "exempt" for c in cards) else "counted against the SLO like any other")
    per = "; ".join(f"{c['policy']} {int(c.get('cold_started_requests') or 0):,} (warm idle "
                    f"{gpu_hours(float(c.get('warm_idle_gpu_hours') or 0.0))} GPU-h)" for c in _ordered(cards))
    return [f"cold-started requests (arrived with no routable replica), {how}: {per}"]


def defaults_line(cards: Sequence[Card]) -> str | None:
    """The target "at defaults, slotwise never uses more GPU-hours than HPA at its defaults unless it has fewer
    violating requests", and which case this run is (exact numbers: 0.1 % more GPU-hours is more)."""
    me = next((c for c in cards if c["policy"] == SUBJECT), None)
    hpa = next((c for c in cards if c["policy"] == DEFAULTS_BASELINE), None)
    if me is None or hpa is None:
        return None
    more = float(me["gpu_hours"]) > float(hpa["gpu_hours"]) + 1e-9
    fewer = int(me["violating_requests"]) < int(hpa["violating_requests"])
    if not more:
        verdict = "met: no more GPU-hours" + (", and fewer violating requests" if fewer else "")
    elif fewer:
        verdict = "met: more GPU-hours, but fewer violating requests"
    else:
        verdict = "MISSED: more GPU-hours and no fewer violating requests"
    return (f"vs {DEFAULTS_BASELINE} at its defaults (target: {SUBJECT} uses no more GPU-hours unless it has fewer "
            f"violating requests): {verdict}")


def headline(cards: Sequence[Card]) -> list[str]:
    """The lines to print before the table (module docstring)."""
    if not cards:
        return []
    hours = cards[0].get("cost", {}).get("hours")
    scored = f"; {float(hours):.2g} h scored" if hours and hours < 10 else f"; {hours:.0f} h scored" if hours else ""
    if any(c.get("cold_start_slo") == "exempt" for c in cards):
        scored += "; cold-started requests exempt"
    lines = [f"GPU-hours each policy needs at its SLO (objective: >= {SLO_OBJECTIVE:.1%} of requests in "
             f"SLO-meeting model-minutes{scored})"]
    lines += policy_lines(cards)
    lines.append(at_slo_line(cards))
    lines += lower_bound_lines(cards)
    lines += cold_start_lines(cards)
    d = defaults_line(cards)
    if d is not None:
        lines.append(d)
    return lines
