"""Which devices a DRA DeviceClass selects, and which devices are tainted: pure.

A claim names a DeviceClass (``deviceClassName``); the scheduler allocates only devices every CEL selector of that
class (``spec.selectors[].cel.expression``) accepts. slotwise's own claims name NVIDIA's ``gpu.nvidia.com`` (whole
GPUs, shares) and ``mig.nvidia.com`` (MIG devices), whose selectors the driver's chart sets to
``device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'`` (``'mig'``); an admin
may narrow them (e.g. ``&& device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'``). A device
the class does not select is no capacity for slotwise's claims, whatever the slice publishes.

Not a CEL interpreter: what is evaluated is a conjunction (``&&``) of equalities and inequalities (``==``,
``!=``) between ``device.driver`` or an attribute (``device.attributes["<domain>"].<name>`` or
``device.attributes["<domain>"]["<name>"]``) and a literal (string in either quote, int, ``true``/``false``),
and the literal ``true``. Anything else (``||``, ``!``, parentheses, functions, ``device.capacity``, ``in``,
comparisons of quantities or versions) is *not understood*: the class then counts as selecting no device
(conservative: an unknown selector could reject any device), and a problem line says which class and expression.
A missing attribute is a CEL runtime error for the scheduler, so that device is not selected either.

Device taints (``devices[].taints``, KEP 5055, ``resource.k8s.io`` v1beta2 / v1, v1beta1 under ``basic:``):
{``key``, ``value``, ``effect``}. ``NoSchedule`` keeps new claims off the device (allocated ones stay),
``NoExecute`` evicts the pods using it too; either way the device takes no new replica. Upstream says consumers
must treat unknown effects (and ``None``) as no effect, so only those two count. Claims that tolerate a taint may
still get the device; slotwise's claims carry no tolerations, so it does not read them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.live.kube.fields import metadata

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<int>-?\d+)|(?P<op>==|!=|&&)"""
                    r"""|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[.\[\]])|(?P<other>\S))""")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


def device_taints(body: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The taints of one device's fields (v1 / v1beta2 device, or v1beta1's ``basic``)."""
    out = []
    for t in body.get("taints") or ():
        if isinstance(t, Mapping) and t.get("key"):
            out.append(Taint(str(t["key"]), str(t.get("value") or ""), str(t.get("effect") or "")))
    return tuple(out)


def blocking(taints: Iterable[Taint]) -> list[Taint]:
    """The taints that keep a new (untolerating) claim off the device."""
    return [t for t in taints if t.effect in BLOCKING_EFFECTS]


# -- one comparison of a selector ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    """``<what> <op> <literal>``: ``what`` is ``("driver",)`` or ``("attr", domain, name)``."""

    what: tuple[str, ...]
    equal: bool
    literal: Any


class NotUnderstood(ValueError):
    """A selector outside the evaluated subset."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:  # only trailing whitespace is left
            break
        pos = m.end()
        kind = m.lastgroup
        assert kind is not None
        if kind == "other":
            raise NotUnderstood(f"unexpected {m[kind]!r}")
        out.append((kind, m[kind]))
    return out


def _literal(tok: tuple[str, str]) -> tuple[bool, Any]:
    kind, text = tok
    if kind == "str":
        body = text[1:-1]
        return True, re.sub(r"\\(.)", r"\1", body)
    if kind == "int":
        return True, int(text)
    if kind == "ident" and text in ("true", "false"):
        return True, text == "true"
    return False, None


def _operand(toks: list[tuple[str, str]]) -> tuple[str, ...]:
    """``device.driver``, ``device.attributes["d"].n`` or ``device.attributes["d"]["n"]`` -> what it reads."""
    texts = [t for _, t in toks]
    if texts == ["device", ".", "driver"]:
        return ("driver",)
    if len(toks) >= 7 and texts[:4] == ["device", ".", "attributes", "["] and toks[4][0] == "str" and texts[5] == "]":
        domain = str(_literal(toks[4])[1])
        rest = toks[6:]
        if len(rest) == 2 and rest[0][1] == "." and rest[1][0] == "ident":
            return ("attr", domain, rest[1][1])
        if len(rest) == 3 and rest[0][1] == "[" and rest[1][0] == "str" and rest[2][1] == "]":
            return ("attr", domain, str(_literal(rest[1])[1]))
    raise NotUnderstood(f"cannot read {' '.join(texts)!r}")


def _term(toks: list[tuple[str, str]]) -> Term | None:
    """One conjunct; None for the literal ``true``."""
    if [t for _, t in toks] == ["true"]:
        return None
    ops = [i for i, (k, _) in enumerate(toks) if k == "op"]
    if len(ops) != 1:
        raise NotUnderstood("not one comparison")
    i = ops[0]
    left, right = toks[:i], toks[i + 1:]
    equal = toks[i][1] == "=="
    for a, b in ((left, right), (right, left)):
        if len(b) == 1:
            ok, value = _literal(b[0])
            if ok:
                return Term(_operand(a), equal, value)
    raise NotUnderstood("a comparison without a literal")


def compile_selector(expr: str) -> tuple[Term, ...]:
    """The conjunction ``expr`` is, as terms; :class:`NotUnderstood` outside the evaluated subset."""
    toks = _tokens(expr)
    if not toks:
        raise NotUnderstood("empty expression")
    parts: list[list[tuple[str, str]]] = [[]]
    for tok in toks:
        if tok == ("op", "&&"):
            parts.append([])
        else:
            parts[-1].append(tok)
    terms = [_term(p) for p in parts]
    return tuple(t for t in terms if t is not None)


def _holds(term: Term, driver: str, attributes: Mapping[str, Any]) -> bool:
    if term.what == ("driver",):
        value: Any = driver
    else:
        _, domain, name = term.what
        # the driver's own attributes are stored unqualified (dra.raw_device), others as "<domain>/<name>"
        key = name if domain == driver else f"{domain}/{name}"
        if key not in attributes:
            return False  # a missing attribute is a CEL runtime error: the device is not selected
        value = attributes[key]
    same = type(value) is type(term.literal) and value == term.literal
    return same if term.equal else not same


# -- a DeviceClass ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceClassCheck:
    """One DeviceClass as slotwise evaluates it: its selectors' terms, or why they are not understood."""

    name: str
    terms: tuple[Term, ...] = ()
    not_understood: str | None = None  # the expression and why; the class then selects no device

    def selects(self, driver: str, attributes: Mapping[str, Any]) -> bool:
        if self.not_understood is not None:
            return False
        return all(_holds(t, driver, attributes) for t in self.terms)


def device_class_check(obj: Mapping[str, Any]) -> DeviceClassCheck:
    """A served DeviceClass -> its check (every selector must accept a device; no selector: every device)."""
    name = str(metadata(obj).get("name") or "")
    terms: list[Term] = []
    for sel in (obj.get("spec") or {}).get("selectors") or ():
        expr = (sel.get("cel") or {}).get("expression") if isinstance(sel, Mapping) else None
        if not isinstance(expr, str):
            return DeviceClassCheck(name, not_understood=f"a selector that is not CEL ({sel!r})")
        try:
            terms += compile_selector(expr)
        except NotUnderstood as e:
            return DeviceClassCheck(name, not_understood=f"{expr!r} ({e})")
    return DeviceClassCheck(name, tuple(terms))


def device_class_checks(objs: Iterable[Mapping[str, Any]]) -> dict[str, DeviceClassCheck]:
    """The DeviceClasses by name."""
    return {c.name: c for c in map(device_class_check, objs)}


# -- DeviceTaintRules ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaintRule:
    """A DeviceTaintRule (KEP 5055, alpha: ``resource.k8s.io/v1alpha3`` 1.33+, ``v1beta2`` 1.36): one taint on every
    device its selector matches, "the same effect as if the taint was specified directly in the ResourceSlice".
    Every field set must match (``driver``, ``pool``, ``device``; v1alpha3 up to 1.34 also ``deviceClassName`` and
    CEL ``selectors``); no selector at all matches no device."""

    name: str
    taint: Taint
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    device_class: str | None = None
    selectors: tuple[DeviceClassCheck, ...] = ()
    matches_none: bool = False

    def applies(self, driver: str, pool: str, device: str, attributes: Mapping[str, Any],
                classes: Mapping[str, DeviceClassCheck] | None) -> bool:
        """Whether the rule taints this device. A class or selector slotwise cannot evaluate (unknown class, a
        selector outside the subset) counts as matching: a taint too many keeps a replica off a device, a taint
        too few puts one on a device the scheduler will not give."""
        if self.matches_none:
            return False
        if (self.driver is not None and self.driver != driver) or (self.pool is not None and self.pool != pool) \
                or (self.device is not None and self.device != device):
            return False
        checks = list(self.selectors)
        if self.device_class is not None:
            known = (classes or {}).get(self.device_class)
            if known is not None:
                checks.append(known)
        return all(c.not_understood is not None or c.selects(driver, attributes) for c in checks)


def taint_rule(obj: Mapping[str, Any]) -> TaintRule | None:
    """A served DeviceTaintRule -> its rule; None without a taint key."""
    spec = obj.get("spec") or {}
    taint = spec.get("taint") or {}
    if not isinstance(taint, Mapping) or not taint.get("key"):
        return None
    name = str(metadata(obj).get("name") or "")
    t = Taint(str(taint["key"]), str(taint.get("value") or ""), str(taint.get("effect") or ""))
    sel = spec.get("deviceSelector")
    if not isinstance(sel, Mapping):
        return TaintRule(name, t, matches_none=True)

    def opt(k: str) -> str | None:
        return str(sel[k]) if sel.get(k) else None

    checks = tuple(device_class_check({"metadata": {"name": name}, "spec": {"selectors": [s]}})
                   for s in sel.get("selectors") or ())
    return TaintRule(name, t, opt("driver"), opt("pool"), opt("device"), opt("deviceClassName"), checks)


def taint_rules(objs: Iterable[Mapping[str, Any]]) -> list[TaintRule]:
    """The rules by name, each once (a server serving both versions lists the same rule twice)."""
    seen: dict[str, TaintRule] = {}
    for obj in objs:
        rule = taint_rule(obj)
        if rule is not None:
            seen.setdefault(rule.name, rule)
    return [seen[k] for k in sorted(seen)]
