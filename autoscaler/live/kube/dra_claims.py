"""A slot on a DRA node, as Kubernetes expresses it: a ResourceClaimTemplate the workload's pod template references.
Pure rendering; the actuator (:meth:`~autoscaler.live.kube.actuator.KubeActuator._template`) writes it.

What the decision core asks for is a :class:`~autoscaler.api.plan.SetSlotTemplate`: device-plugin ``resources``
(``nvidia.com/gpu: N``, ``nvidia.com/mig-<profile>: 1``) and a node selector with GPU Feature Discovery's
``nvidia.com/gpu.product``. On nodes of NVIDIA's DRA driver that becomes (``k8s.io/api/resource/v1`` types.go;
the driver's DeviceClasses ``gpu.nvidia.com`` and ``mig.nvidia.com``, deployments/helm/.../deviceclass-*.yaml):

- **whole GPUs**: one request, ``deviceClassName: gpu.nvidia.com``, ``allocationMode: ExactCount``, ``count: N``;
- **a MIG profile**: ``deviceClassName: mig.nvidia.com`` and a CEL selector on the driver's ``profile`` attribute
  (``device.attributes["gpu.nvidia.com"].profile == "3g.40gb"``); with DynamicMIG the driver creates the instance
  at allocation, without it one that exists is taken;
- **a share** (only where the driver advertises consumable capacity, ``allowMultipleAllocations``, KEP 5075):
  the whole-GPU class with ``capacity.requests.memory``;
- the GPU product, where the plan names one, as a CEL selector on ``productName`` (the driver's NVML name; GFD's
  label spells it with dashes, so the selector compares that spelling when the exact name is not known).

``resource.k8s.io/v1`` and ``v1beta2`` put a request's fields under ``exactly:``; ``v1beta1`` has them on the
request itself (and no consumable capacity). A template's ``spec`` is immutable, so its name carries a hash of it:
a different slot is a new template (and a new pod template, so a rollout), never an update. It is owned by the
workload (ownerReference), so it goes when the workload goes.

The pod template then gets ``spec.resourceClaims: [{name: slotwise-gpu, resourceClaimTemplateName: <it>}]`` and
the container ``resources.claims: [{name: slotwise-gpu}]``, its ``nvidia.com/*`` resources removed, and the GPU
product taken out of its node selector (DRA nodes carry no GFD labels; the claim selects the product).

Back on device-plugin nodes, slotwise's claim leaves the pod template again (:func:`without_slotwise_claim`).

MIG re-layout (``SetMigLayout``) on a DRA node has nothing to write with DynamicMIG (claims create instances), and
is refused without it: :func:`mig_relayout_refusal`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.live.kube.dra import DRIVER, GPU_CLASS, MIG_CLASS, DraInventory
from autoscaler.live.kube.gpu_nodes import is_gpu_resource
from autoscaler.live.kube.objects import FIELD_MANAGER, GPU_RESOURCE, MIG_RESOURCE_PREFIX, ManagedModel
from sharing.render import GPU_PRODUCT

CLAIM_NAME = "slotwise-gpu"  # the pod-level claim name slotwise owns in a pod template
REQUEST_NAME = "gpu"
GROUP = "resource.k8s.io"
DYNAMIC_MIG_GATE = "DynamicMIG"  # the DRA driver's feature gate (featureGates.DynamicMIG in its Helm values)


@dataclass(frozen=True)
class DraTarget:
    """The DRA nodes a slot template's pods would land on: what the claim may select and ask for."""

    nodes: tuple[str, ...]
    product_name: str | None  # the driver's productName when the nodes agree on one
    shareable: bool  # every GPU there takes shares (consumable capacity)


def dra_target(dra: DraInventory, plugin_nodes: Iterable[tuple[str, Mapping[str, str]]],
               node_selector: Mapping[str, str]) -> DraTarget | None:
    """Whether pods of a template with ``node_selector`` land on DRA nodes: some DRA node has the GPU product it
    names (any, when it names none) and no device-plugin node (``plugin_nodes``: name, labels) does. None: the
    device-plugin path (a pod template cannot ask both ways; with both kinds of nodes the device plugin's stays)."""
    product = node_selector.get(GPU_PRODUCT)
    hits = [dn for dn in dra.nodes.values() if product is None or dn.spec.labels.get(GPU_PRODUCT) == product]
    plugin = [n for n, labels in plugin_nodes
              if not dra.named(n) and GPU_PRODUCT in labels and (product is None or labels[GPU_PRODUCT] == product)]
    if not hits or plugin:
        return None
    names = {dn.product_name for dn in hits}
    return DraTarget(tuple(sorted(dn.spec.name for dn in hits)), names.pop() if len(names) == 1 else None,
                     all(d.shareable for dn in hits for d in dn.devices.values() if d.profile is None))


def _cel_string(s: str) -> str:
    return json.dumps(s)  # a CEL string literal: JSON's escaping is valid CEL


def _slot_of(resources: Mapping[str, Any]) -> tuple[str, int, str | None]:
    """(device class, count, MIG profile name) from a SetSlotTemplate's device-plugin resources."""
    limits = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    gpus = {k: v for k, v in limits.items() if k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX)}
    if len(gpus) != 1:
        raise ValueError(f"a slot template asks for one GPU resource, not {sorted(gpus)}")
    ((name, raw),) = gpus.items()
    n = int(str(raw))
    if name == GPU_RESOURCE:
        return GPU_CLASS, n, None
    return MIG_CLASS, n, name.removeprefix(MIG_RESOURCE_PREFIX)


def claim_spec(resources: Mapping[str, Any], node_selector: Mapping[str, str], version: str, *,
               product_name: str | None = None, share_memory_gib: float | None = None) -> dict[str, Any]:
    """The ResourceClaimSpec (``devices.requests``) for a SetSlotTemplate's slot, in ``version``'s shape.

    ``product_name``: the driver's exact ``productName`` for the GFD product in ``node_selector`` (else the selector
    compares GFD's spelling); ``share_memory_gib``: ask for a share of that much memory of one GPU (only where the
    driver advertises consumable capacity; v1 and v1beta2)."""
    device_class, count, profile = _slot_of(resources)
    attrs = f'device.attributes["{DRIVER}"]'
    selectors: list[str] = []
    gfd = node_selector.get(GPU_PRODUCT)
    if product_name:
        selectors.append(f"{attrs}.productName == {_cel_string(product_name)}")
    elif gfd:
        selectors.append(f'{attrs}.productName.replace(" ", "-") == {_cel_string(gfd)}')
    if profile is not None:
        selectors.append(f"{attrs}.profile == {_cel_string(profile)}")
    request: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selectors:
        request["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if share_memory_gib is not None:
        if version == "v1beta1":
            raise ValueError("resource.k8s.io/v1beta1 has no consumable capacity: a share cannot be requested")
        if profile is not None or count != 1:
            raise ValueError("a share is of one whole GPU")
        request["capacity"] = {"requests": {"memory": f"{int(round(share_memory_gib * 1024))}Mi"}}
    if version == "v1beta1":
        return {"devices": {"requests": [{"name": REQUEST_NAME, **request}]}}
    return {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": request}]}}


def template_name(workload: str, spec: Mapping[str, Any]) -> str:
    """``<workload>-gpu-<hash of the spec>``: the spec is immutable, so another slot is another template."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return f"{workload[:240]}-gpu-{digest}"


def claim_template(namespace: str, owner: Mapping[str, str], spec: Mapping[str, Any], version: str,
                   component: str = FIELD_MANAGER) -> dict[str, Any]:
    """The ResourceClaimTemplate object, owned by the workload ``owner`` (apiVersion, kind, name, uid)."""
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(owner["name"], spec),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": component},
            "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["name"],
                                 "uid": owner["uid"], "blockOwnerDeletion": False, "controller": False}],
        },
        "spec": {"spec": dict(spec)},
    }


def pod_template_changes(pod_spec: Mapping[str, Any], container: str, template: str) -> dict[str, Any]:
    """What the pod template becomes: ``resourceClaims``, the container's ``resources`` (its ``nvidia.com/*``
    resources gone, the claim added) and ``nodeSelector`` (GFD's product gone). Returns the three new values
    (``nodeSelector`` None: remove it); the caller compares and patches."""
    claims = [c for c in pod_spec.get("resourceClaims") or () if c.get("name") != CLAIM_NAME]
    claims.append({"name": CLAIM_NAME, "resourceClaimTemplateName": template})
    containers = pod_spec.get("containers") or []
    c = next((c for c in containers if c.get("name") == container), None)
    if c is None:
        raise ValueError(f"container {container!r} not in the pod template")
    res = {k: v for k, v in (c.get("resources") or {}).items()}
    for part in ("limits", "requests"):
        if part in res:
            kept = {k: v for k, v in (res[part] or {}).items() if not k.startswith("nvidia.com/")}
            if kept:
                res[part] = kept
            else:
                del res[part]
    res["claims"] = [*(x for x in res.get("claims") or () if x.get("name") != CLAIM_NAME), {"name": CLAIM_NAME}]
    sel = {k: v for k, v in (pod_spec.get("nodeSelector") or {}).items() if k != GPU_PRODUCT}
    return {"resourceClaims": claims, "resources": res, "nodeSelector": sel or None}


def without_slotwise_claim(pod_spec: Mapping[str, Any],
                           container: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """The container's ``resources`` and the pod spec's ``resourceClaims`` without slotwise's claim
    (:data:`CLAIM_NAME`, what :func:`pod_template_changes` added): a model moved from a DRA pool to a device-plugin
    one asks for ``nvidia.com/*`` resources, and a pod still claiming the DRA slot beside them never schedules.
    Claims that are not slotwise's stay. ``resources`` loses its ``claims`` key when none is left; the claims list
    is None when none is left (the field is removed) or when the pod spec had none."""
    res = dict(container.get("resources") or {})
    if "claims" in res:
        kept = [c for c in res["claims"] or () if not (isinstance(c, Mapping) and c.get("name") == CLAIM_NAME)]
        if kept:
            res["claims"] = kept
        else:
            del res["claims"]
    claims = [dict(c) for c in pod_spec.get("resourceClaims") or ()
              if not (isinstance(c, Mapping) and c.get("name") == CLAIM_NAME)]
    return res, claims or None


def claim_removal_ops(pointer: str, pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON-patch operations that take slotwise's claim out of the pod template at ``pointer``'s
    ``spec.resourceClaims`` (:func:`without_slotwise_claim`): the list without it replaced, or the field removed
    when nothing else is left; none when the template has no such claim."""
    present = pod_spec.get("resourceClaims") or ()
    if not any(isinstance(c, Mapping) and c.get("name") == CLAIM_NAME for c in present):
        return []
    _, kept = without_slotwise_claim(pod_spec, {})
    path = f"{pointer}/spec/resourceClaims"
    return [{"op": "replace", "path": path, "value": kept}] if kept else [{"op": "remove", "path": path}]


def mig_relayout_refusal(node: str, dynamic: bool) -> tuple[str, str]:
    """(skip reason, message) for a SetMigLayout on a DRA node: with DynamicMIG nothing is written (the claims make
    the instances); without it the layout is the driver's static MIG config, which slotwise does not change."""
    if dynamic:
        return ("dra-dynamic-mig",
                f"node {node}: the NVIDIA DRA driver's {DYNAMIC_MIG_GATE} publishes every MIG placement; the "
                "ResourceClaims create the instances, nothing to relabel")
    return ("dra-static-mig",
            f"node {node}: MIG re-layout refused: the NVIDIA DRA driver publishes only the MIG devices that exist "
            f"(static MIG) and slotwise does not re-partition under it; enable the driver's {DYNAMIC_MIG_GATE} "
            "feature gate (featureGates.DynamicMIG=true) for layouts chosen by claims")


_PROFILE_SELECTOR = re.compile(r'\.profile\s*==\s*"([^"]+)"')


def slot_resources(template_spec: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The device-plugin resources a ResourceClaimTemplate's spec (``spec.spec``, any served version) stands for:
    what a model whose pod template references it asks for, in the terms the decision core compares templates
    in (``nvidia.com/gpu: N``, ``nvidia.com/mig-<profile>: 1``). Empty when it asks for no NVIDIA GPU or for
    something slotwise does not render (several requests, a MIG request without a profile selector)."""
    requests = ((template_spec.get("devices") or {}).get("requests")) or []
    if len(requests) != 1:
        return {}
    req = requests[0].get("exactly") or requests[0]
    count = str(req.get("count") or 1)
    if req.get("deviceClassName") == GPU_CLASS:
        got = {GPU_RESOURCE: count}
    elif req.get("deviceClassName") == MIG_CLASS:
        exprs = " ".join(str((s.get("cel") or {}).get("expression") or "") for s in req.get("selectors") or ())
        m = _PROFILE_SELECTOR.search(exprs)
        if m is None:
            return {}
        got = {MIG_RESOURCE_PREFIX + m[1]: count}
    else:
        return {}
    return {"requests": dict(got), "limits": dict(got)}


def unread_ask(template_spec: Mapping[str, Any]) -> str | None:
    """Why :func:`slot_resources` reads nothing from a ResourceClaimTemplate's spec that asks for devices (None
    when it reads it, or when the spec asks for nothing): what a problem line says, so that a model whose pods
    claim their GPU through a class slotwise does not plan for (another DeviceClass, several requests, a
    ``firstAvailable`` list) is said to be read as asking for no GPU, not silently so."""
    requests = ((template_spec.get("devices") or {}).get("requests")) or []
    if not requests or slot_resources(template_spec):
        return None
    if len(requests) != 1:
        return f"{len(requests)} device requests (slotwise reads one)"
    req = requests[0].get("exactly") or requests[0]
    if req.get("firstAvailable"):
        return "a firstAvailable list of alternatives"
    device_class = req.get("deviceClassName")
    if device_class not in (GPU_CLASS, MIG_CLASS):
        return f"DeviceClass {device_class!r} (slotwise plans slots of {GPU_CLASS} and {MIG_CLASS} only)"
    return f"a {MIG_CLASS} request without a profile selector"


def _asks_gpu(resources: Mapping[str, Any]) -> bool:
    return any(is_gpu_resource(k) for part in ("requests", "limits") for k in resources.get(part) or {})


def template_claims(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """A pod spec's claims made from ResourceClaimTemplates: claim name -> template name (v1's
    ``resourceClaimTemplateName``; the 1.26-1.30 alpha's ``source.resourceClaimTemplateName`` too)."""
    out: dict[str, str] = {}
    for c in pod_spec.get("resourceClaims") or ():
        if not isinstance(c, Mapping) or not c.get("name"):
            continue
        name = c.get("resourceClaimTemplateName") or (c.get("source") or {}).get("resourceClaimTemplateName")
        if name:
            out[str(c["name"])] = str(name)
    return out


def with_claimed_resources(models: Mapping[str, ManagedModel], templates: Iterable[Mapping[str, Any]],
                           problems: list[str] | None = None) -> dict[str, ManagedModel]:
    """The models whose container claims its GPU through a ResourceClaimTemplate, with that template's ask read into
    ``resources`` as device-plugin resources (:func:`slot_resources`): the decision core compares a model's
    template with the slot it plans in those terms, so a DRA model is not re-templated to what it already has.
    Only models that change are returned; a claim whose template asks for what slotwise does not read is a line in
    ``problems`` (:func:`unread_ask`)."""
    by_key = {(str((t.get("metadata") or {}).get("namespace")), str((t.get("metadata") or {}).get("name"))): t
              for t in templates}
    out: dict[str, ManagedModel] = {}
    for key, mm in models.items():
        claimed = [n.get("name") for n in (mm.resources.get("claims") or ()) if isinstance(n, Mapping)]
        asks: dict[str, dict[str, str]] = {}
        unread: list[str] = []
        for claim in claimed:
            tmpl = by_key.get((mm.namespace, mm.claim_templates.get(str(claim), "")))
            spec = ((tmpl or {}).get("spec") or {}).get("spec") or {}
            got = slot_resources(spec) if tmpl else {}
            why = unread_ask(spec) if tmpl else None
            if why is not None:
                unread.append(f"claim {claim} (ResourceClaimTemplate {mm.namespace}/"
                              f"{mm.claim_templates.get(str(claim))}) asks for {why}")
            for part, values in got.items():
                asks.setdefault(part, {}).update(values)
        if unread and problems is not None and not asks and not _asks_gpu(mm.resources):
            # said only where it matters: the model then reads as asking for no GPU (a NIC claim beside
            # nvidia.com/gpu is nobody's business here)
            problems.append(f"{mm.kind.lower()} {key}: {'; '.join(unread)}: not read as a GPU slot, the model "
                            "reads as asking for no GPU")
        if asks:
            resources = {k: dict(v) if isinstance(v, Mapping) else v for k, v in mm.resources.items()}
            for part, values in asks.items():
                resources[part] = {**(resources.get(part) or {}), **values}
            out[key] = replace(mm, resources=resources)
    return out
