"""Preemptible training workloads (labelled ``slotwise.io/preemptible=true``) -> what the lend stage sees: pure.

Three kinds are read, each once: a **Job** (its pods by ownerReference or the Job controller's job-name label),
a **Kueue Workload** (admitted = running; its pods are its Job's), and a bare **Pod**. A Pod or Workload that
belongs to a labelled Job is counted with that Job, never twice. Each workload gives a
:class:`~autoscaler.api.snapshot.TrainingWorkload` (how many GPUs, on which nodes, since when, its grace and
last checkpoint) and a :class:`~autoscaler.live.kube.objects.TrainingRef`, how the lending actuator addresses it
on a reclaim (its live pods, the Kueue Workloads that admit it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.api.snapshot import TrainingWorkload
from autoscaler.live.kube.fields import (
    DEFAULT_GRACE_S,
    condition,
    grace_s,
    metadata,
    owner_ref,
    parse_count,
    parse_time,
)
from autoscaler.live.kube.gpu_nodes import pod_gpu_requests
from autoscaler.live.kube.objects import (
    GPU_RESOURCE,
    LAST_CHECKPOINT_ANNOTATION,
    MIG_RESOURCE_PREFIX,
    PREEMPTIBLE_LABEL,
    TrainingRef,
    object_key,
)
from autoscaler.live.kube.pods import LivePod
from sharing.catalog import Catalog

_JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")


def _kind(obj: Mapping[str, Any]) -> str:
    """The object's kind; list responses omit it on items, so infer it from the shape then."""
    kind = obj.get("kind")
    if kind:
        return str(kind)
    spec = obj.get("spec") or {}
    if "containers" in spec:
        return "Pod"
    if "podSets" in spec:
        return "Workload"
    return "Job"


def _gpu_equivalents(requests: Mapping[str, int], catalog: Catalog) -> float:
    """GPUs a request costs: nvidia.com/gpu counts whole, a MIG instance its profile's share of compute."""
    total = 0.0
    for res, n in requests.items():
        if res == GPU_RESOURCE:
            total += n
            continue
        total += n * _mig_fraction(res, catalog)
    return total


def _mig_fraction(resource: str, catalog: Catalog) -> float:
    """A MIG resource's share of its GPU's compute (the first catalog GPU offering the profile says)."""
    for name in catalog.names():
        g = catalog.get(name)
        if not g.mig_capable:
            continue
        try:
            return g.compute_fraction(g.profile(resource))
        except KeyError:
            continue
    # A profile no catalog GPU has: read "<c>g" as c of a 7-slice GPU's compute.
    m = re.match(r"(\d+)g", resource[len(MIG_RESOURCE_PREFIX):])
    return min(1.0, int(m.group(1)) / 7) if m else 1.0


@dataclass(frozen=True)
class _Index:
    """Who belongs to whom among the labelled objects and the live pods."""

    jobs: frozenset[str]  # keys of the labelled Jobs
    job_uids: frozenset[str]
    pods_of_job: Mapping[str, Sequence[LivePod]]  # Job key -> its live pods
    workloads_of: Mapping[tuple[str, str, str], Sequence[str]]  # (owner kind, ns, owner name) -> Workload keys

    def has_job(self, ref: Mapping[str, Any] | None, ns: str) -> bool:
        """Whether an ownerReference points at a labelled Job (by uid, or by name in the namespace)."""
        return ref is not None and (str(ref.get("uid")) in self.job_uids or f"{ns}/{ref.get('name')}" in self.jobs)


def _labelled(
    objects: Iterable[Mapping[str, Any]], pods: Sequence[LivePod]
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """(kind, key) -> object, for every preemptible object and pod (a pod listed in both: its object)."""
    labelled: dict[tuple[str, str], Mapping[str, Any]] = {}
    for obj in objects:
        if (metadata(obj).get("labels") or {}).get(PREEMPTIBLE_LABEL) == "true":
            labelled[(_kind(obj), object_key(obj))] = obj
    for p in pods:
        if p.labels.get(PREEMPTIBLE_LABEL) == "true":
            labelled.setdefault(("Pod", p.key), p.obj)
    return labelled


def _index(labelled: Mapping[tuple[str, str], Mapping[str, Any]], pods: Sequence[LivePod]) -> _Index:
    # A Job's pods: by ownerReference uid (a real cluster) or the job-name label (set by the Job controller).
    pods_of_job: dict[str, list[LivePod]] = {}
    for p in pods:
        ref = owner_ref(p.obj, "Job")
        job = None
        if ref is not None:
            job = f"{p.namespace}/{ref.get('name')}"
        else:
            for lbl in _JOB_NAME_LABELS:
                if lbl in p.labels:
                    job = f"{p.namespace}/{p.labels[lbl]}"
                    break
        if job is not None:
            pods_of_job.setdefault(job, []).append(p)
    # Kueue Workloads by the object that owns them (a Job, or a plain pod with Kueue's pod integration): the
    # lending actuator deactivates these when it reclaims the owner.
    workloads_of: dict[tuple[str, str, str], list[str]] = {}
    for (kind, key), obj in labelled.items():
        if kind != "Workload":
            continue
        ns = metadata(obj).get("namespace") or ""
        for ref in metadata(obj).get("ownerReferences") or ():
            workloads_of.setdefault((str(ref.get("kind")), ns, str(ref.get("name"))), []).append(key)
    return _Index(
        jobs=frozenset(k for kind, k in labelled if kind == "Job"),
        job_uids=frozenset(str(metadata(o).get("uid")) for (kind, _), o in labelled.items() if kind == "Job"),
        pods_of_job=pods_of_job,
        workloads_of=workloads_of,
    )


def read_training(
    objects: Iterable[Mapping[str, Any]],
    pods: Sequence[LivePod],
    catalog: Catalog,
    problems: list[str],
) -> tuple[tuple[TrainingWorkload, ...], dict[str, TrainingRef]]:
    """The preemptible training workloads, and how to address each (its pods, the Kueue Workloads admitting it)."""
    labelled = _labelled(objects, pods)
    index = _index(labelled, pods)
    out: list[TrainingWorkload] = []
    refs: dict[str, TrainingRef] = {}
    for (kind, key), obj in sorted(labelled.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        checkpoint_raw = (metadata(obj).get("annotations") or {}).get(LAST_CHECKPOINT_ANNOTATION)
        checkpoint = parse_time(checkpoint_raw)
        if checkpoint_raw is not None and checkpoint is None:
            problems.append(f"{kind} {key}: {LAST_CHECKPOINT_ANNOTATION}={checkpoint_raw!r} is not an RFC 3339 time")
        if kind == "Pod":
            got = _pod(key, obj, index, catalog, checkpoint)
        elif kind == "Workload":
            got = _workload(key, obj, index, catalog, checkpoint)
        else:
            got = _job(key, kind, obj, index, catalog, checkpoint)
        if got is not None:
            workload, ref = got
            refs[key] = ref
            out.append(workload)
    return tuple(out), refs


def _pod(key: str, obj: Mapping[str, Any], index: _Index, catalog: Catalog,
         checkpoint: float | None) -> tuple[TrainingWorkload, TrainingRef] | None:
    """A bare training pod; None when it is counted with its Job."""
    meta = metadata(obj)
    ns = meta.get("namespace") or ""
    if index.has_job(owner_ref(obj, "Job"), ns) or any(
        f"{ns}/{(meta.get('labels') or {}).get(lbl)}" in index.jobs for lbl in _JOB_NAME_LABELS
    ):
        return None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    node = spec.get("nodeName")
    ref = TrainingRef(key, "Pod", ns, str(meta.get("uid") or ""), (key,),
                      tuple(sorted(index.workloads_of.get(("Pod", ns, str(meta.get("name"))), []))))
    return TrainingWorkload(
        name=key,
        kind="Pod",
        gpus=_gpu_equivalents(pod_gpu_requests(spec), catalog),
        nodes=(node,) if node else (),
        running=status.get("phase") == "Running",
        grace_s=grace_s(spec),
        started_at=parse_time(status.get("startTime")) or parse_time(meta.get("creationTimestamp")),
        last_checkpoint_at=checkpoint,
    ), ref


def _workload(key: str, obj: Mapping[str, Any], index: _Index, catalog: Catalog,
              checkpoint: float | None) -> tuple[TrainingWorkload, TrainingRef] | None:
    """A Kueue Workload (running while admitted and not finished); None when its Job is labelled too."""
    meta = metadata(obj)
    ns = meta.get("namespace") or ""
    job = owner_ref(obj, "Job")
    if index.has_job(job, ns):
        return None  # the Job says the same, and knows its pods
    spec = obj.get("spec") or {}
    gpus = 0.0
    graces = []
    for ps in spec.get("podSets") or ():
        pspec = (ps.get("template") or {}).get("spec") or {}
        count = parse_count(ps.get("count"))
        gpus += (1 if count is None else count) * _gpu_equivalents(pod_gpu_requests(pspec), catalog)
        graces.append(grace_s(pspec))
    admitted = condition(obj, "Admitted")
    finished = condition(obj, "Finished")
    running = bool(admitted and admitted.get("status") == "True") and not (
        finished and finished.get("status") == "True"
    )
    job_pods = index.pods_of_job.get(f"{ns}/{job.get('name')}", []) if job is not None else []
    ref = TrainingRef(key, "Workload", ns, str(meta.get("uid") or ""), tuple(sorted(p.key for p in job_pods)), (key,))
    return TrainingWorkload(
        name=key,
        kind="Workload",
        gpus=gpus,
        nodes=tuple(sorted({p.node for p in job_pods if p.node})),
        running=running,
        grace_s=max(graces, default=DEFAULT_GRACE_S),  # reclaim waits for the slowest pod set
        started_at=parse_time(admitted.get("lastTransitionTime")) if admitted else None,
        last_checkpoint_at=checkpoint,
    ), ref


def _job(key: str, kind: str, obj: Mapping[str, Any], index: _Index, catalog: Catalog,
         checkpoint: float | None) -> tuple[TrainingWorkload, TrainingRef]:
    """A Job (or any other labelled kind, read as one): ``parallelism`` pods of its template."""
    meta = metadata(obj)
    ns = meta.get("namespace") or ""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    pspec = (spec.get("template") or {}).get("spec") or {}
    parallelism = parse_count(spec.get("parallelism"))
    width = 1 if parallelism is None else parallelism
    job_pods = index.pods_of_job.get(key, [])
    ref = TrainingRef(key, kind, ns, str(meta.get("uid") or ""), tuple(sorted(p.key for p in job_pods)),
                      tuple(sorted(index.workloads_of.get((kind, ns, str(meta.get("name"))), []))))
    return TrainingWorkload(
        name=key,
        kind=kind,
        gpus=width * _gpu_equivalents(pod_gpu_requests(pspec), catalog),
        nodes=tuple(sorted({p.node for p in job_pods if p.node})),
        running=(parse_count(status.get("active")) or 0) > 0 and not spec.get("suspend", False),
        grace_s=grace_s(pspec),
        started_at=parse_time(status.get("startTime")),
        last_checkpoint_at=checkpoint,
    ), ref
