"""Plays the parts a bare kube-apiserver lacks, so a controller test sees a cluster that moves.

The test apiserver (``realparts.kube``) stores and serves objects but runs no controllers. The controller under
test only scales Deployments, patches templates, labels and cordons nodes; something must turn that into pods
and MIG layouts. :class:`ClusterPlay` does, through the same real API, one ``step()`` at a time:

- **ReplicaSet controller**: keeps ``spec.replicas`` pods per Deployment (labels and spec from the template);
  scale-down removes pods with the lowest ``controller.kubernetes.io/pod-deletion-cost`` first, then the newest;
- with ``workloads=True``: the **StatefulSet controller** (pods ``<name>-<ordinal>`` for ordinals below
  ``spec.replicas``, the highest removed first) and the **LeaderWorkerSet controller** (per group ``i`` below
  ``spec.replicas``: the leader ``<lws>-<i>`` from ``leaderTemplate`` or else ``workerTemplate`` and workers
  ``<lws>-<i>-<j>``, ``j`` in 1..size-1, labelled ``leaderworkerset.sigs.k8s.io/name``, ``group-index``,
  ``worker-index`` as the upstream controller does; groups at or above ``spec.replicas`` removed whole; the
  status' ``replicas``/``readyReplicas``/``hpaPodSelector`` kept, as the ``/scale`` subresource reads them);
  and the **Argo Rollouts controller**'s pod keeping (a Rollout's ``spec.replicas`` pods, like a ReplicaSet);
- **scheduler**: binds a pending pod to a schedulable node whose allocatable GPU resource (``nvidia.com/gpu``,
  ``nvidia.com/mig-*``) still has room, whose labels match the pod's ``nodeSelector`` and whose taints it tolerates;
- **kubelet**: marks a bound pod Ready ``ready_after_s`` after it was bound, and finishes graceful deletes
  (evictions) at the next step;
- with ``endpoint_slices=True``: the **endpointslice controller** -- per Service of the namespace with a selector,
  one EndpointSlice ``<service>-play`` (``kubernetes.io/service-name``, ``endpointslice.kubernetes.io/managed-by:
  endpointslice-controller.k8s.io``) listing its pods' IPs with their Ready condition, one port per Service port
  (its name, the numeric ``targetPort``); the kubelet then gives each pod ``pod_ip`` as its IP (127.0.0.1 by
  default: the test's own process stands in for the pod); at ``slice_version`` (``v1beta1`` on the 1.20 server);
- **NVIDIA MIG manager**: when a node's ``nvidia.com/mig.config`` label names an entry of the mig-parted
  ConfigMap that differs from what the node has, sets ``nvidia.com/mig.config.state=pending``, and on the next
  step applies it -- capacities ``nvidia.com/mig-<profile>`` become the entry's counts -- and sets ``success``
  (or ``failed`` for config names listed in ``fail_configs``).

It is an emulator for missing components, not a stand-in for the apiserver: every read and write goes to the
real server, so optimistic concurrency, watches and validation are real.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

GPU_PREFIX = "nvidia.com/"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"


def _gpu_requests(pod_spec: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            for k, v in (res.get(part) or {}).items():
                if k.startswith(GPU_PREFIX):
                    out[k] = max(out.get(k, 0), int(v))
    return out


async def create_gpu_node(
    api: client.ApiClient, name: str, product: str, count: int, capacity: dict[str, str],
    labels: dict[str, str] | None = None,
) -> None:
    """A GPU Node as GPU Feature Discovery labels it, with ``capacity`` (= allocatable) set through the status
    subresource (a create ignores status). Nodes are cluster-wide: the caller deletes it."""
    all_labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
                  "nvidia.com/gpu.memory": "81559" if "H100" in product else "23034", **(labels or {})}
    core = client.CoreV1Api(api)
    created = await core.create_node({"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": name, "labels": all_labels}})
    created.status.capacity = dict(capacity)
    created.status.allocatable = dict(capacity)
    await core.replace_node_status(name, created)


def _tolerates(pod_spec: dict, taints: list[dict]) -> bool:
    """Whether the pod tolerates every NoSchedule/NoExecute taint (kube-scheduler's TaintToleration filter)."""
    tolerations = pod_spec.get("tolerations") or []
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if str(taint.get("key", "")).startswith("node.kubernetes.io/"):
            # the apiserver taints new nodes not-ready; the node lifecycle controller (absent here) would lift it
            # once the kubelet reports Ready -- these nodes are "ready" by construction
            continue
        if not any(
            (t.get("operator") == "Exists" and t.get("key") in (None, taint["key"]))
            or (t.get("key") == taint["key"] and t.get("value") == taint.get("value"))
            for t in tolerations
            if t.get("effect") in (None, "", taint.get("effect"))
        ):
            return False
    return True


def _selector_matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


@dataclass
class ClusterPlay:
    api: client.ApiClient
    namespace: str
    ready_after_s: float = 0.0
    mig_configmap: tuple[str, str] = ("gpu-operator", "slotwise-mig-parted-config")
    fail_configs: set[str] = field(default_factory=set)
    node_prefix: str = ""  # only nodes whose name starts with this are scheduled onto / MIG-managed
    workloads: bool = False  # also play the StatefulSet, LeaderWorkerSet and Argo Rollouts controllers
    endpoint_slices: bool = False  # also play the endpointslice controller (and give pods ``pod_ip``)
    pod_ip: str = "127.0.0.1"
    slice_version: str = "v1beta1"
    log: list[str] = field(default_factory=list)
    _seq: int = 0

    def _sanitize(self, obj: Any) -> dict:
        return self.api.sanitize_for_serialization(obj)

    async def nodes(self) -> list[dict]:
        got = await client.CoreV1Api(self.api).list_node()
        return [n for n in (self._sanitize(x) for x in got.items) if n["metadata"]["name"].startswith(self.node_prefix)]

    async def pods(self) -> list[dict]:
        got = await client.CoreV1Api(self.api).list_namespaced_pod(self.namespace)
        return [self._sanitize(p) for p in got.items]

    async def ensure_service_account(self) -> None:
        """The ServiceAccount admission plugin wants a ``default`` ServiceAccount; no controller makes it here."""
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        try:
            await client.CoreV1Api(self.api).create_namespaced_service_account(self.namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise

    async def step(self) -> None:
        await self._terminate()
        await self._replicasets()
        if self.workloads:
            await self._statefulsets()
            await self._leaderworkersets()
            await self._rollouts()
        await self._schedule()
        await self._kubelet()
        if self.endpoint_slices:
            await self._endpointslices()
        await self._mig_manager()

    # -- endpointslice controller -----------------------------------------------------------------------------
    async def _endpointslices(self) -> None:
        core, objects = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        pods = [p for p in await self.pods() if not p["metadata"].get("deletionTimestamp")]
        for svc in (await core.list_namespaced_service(self.namespace)).items:
            svc = self._sanitize(svc)
            selector = (svc.get("spec") or {}).get("selector")
            if not selector:
                continue
            name = svc["metadata"]["name"]
            endpoints = []
            for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
                ip = (p.get("status") or {}).get("podIP")
                if not ip or not _selector_matches(selector, p["metadata"].get("labels") or {}):
                    continue
                conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
                endpoints.append({"addresses": [ip], "conditions": {"ready": conds.get("Ready") == "True"},
                                  "targetRef": {"kind": "Pod", "namespace": self.namespace,
                                                "name": p["metadata"]["name"]}})
            ports = [{"name": port.get("name") or "", "protocol": port.get("protocol") or "TCP",
                      "port": int(port.get("targetPort") or port["port"])} for port in svc["spec"].get("ports") or []]
            body = {"apiVersion": f"discovery.k8s.io/{self.slice_version}", "kind": "EndpointSlice",
                    "metadata": {"name": f"{name}-play", "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                    "addressType": "IPv4", "endpoints": endpoints, "ports": ports}
            args = ("discovery.k8s.io", self.slice_version, self.namespace, "endpointslices")
            try:
                have = await objects.get_namespaced_custom_object(*args, f"{name}-play")
            except ApiException as e:
                if e.status != 404:
                    raise
                await objects.create_namespaced_custom_object(*args, body)
                self.log.append(f"endpointslice {name}: {len(endpoints)}")
                continue
            if (have.get("endpoints") or []) != endpoints or (have.get("ports") or []) != ports:
                body["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
                await objects.replace_namespaced_custom_object(*args, f"{name}-play", body)
                self.log.append(f"endpointslice {name}: {len(endpoints)}")

    # -- ReplicaSet controller --------------------------------------------------------------------------------
    async def _replicasets(self) -> None:
        core = client.CoreV1Api(self.api)
        deps = await client.AppsV1Api(self.api).list_namespaced_deployment(self.namespace)
        pods = await self.pods()
        for d in (self._sanitize(x) for x in deps.items):
            name = d["metadata"]["name"]
            match = d["spec"]["selector"].get("matchLabels") or {}
            mine = [p for p in pods if _selector_matches(match, p["metadata"].get("labels") or {})
                    and not p["metadata"].get("deletionTimestamp")]
            want = int(d["spec"].get("replicas", 1))
            template = d["spec"]["template"]
            for _ in range(want - len(mine)):
                self._seq += 1
                body = {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{name}-{self._seq}",
                                 "labels": dict(template["metadata"].get("labels") or {})},
                    # no token controller here: do not ask for a service-account token volume
                    "spec": {**template["spec"], "automountServiceAccountToken": False},
                }
                await core.create_namespaced_pod(self.namespace, body)
                self.log.append(f"create pod {name}-{self._seq}")
            if len(mine) > want:
                def cost(p: dict) -> tuple:
                    ann = p["metadata"].get("annotations") or {}
                    return (int(ann.get("controller.kubernetes.io/pod-deletion-cost", "0")),
                            -_ts(p["metadata"]["creationTimestamp"]))
                for p in sorted(mine, key=cost)[: len(mine) - want]:
                    # no kubelet to finish a graceful delete: delete at once
                    await core.delete_namespaced_pod(p["metadata"]["name"], self.namespace, grace_period_seconds=0)
                    self.log.append(f"delete pod {p['metadata']['name']}")

    # -- StatefulSet, LeaderWorkerSet and Argo Rollouts controllers (workloads=True) -------------------------
    async def _create_pod(self, name: str, template: dict, labels: dict[str, str],
                          annotations: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {"name": name, "labels": {**(template.get("metadata") or {}).get("labels", {}),
                                                          **labels}}
        if annotations:
            meta["annotations"] = annotations
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {**template["spec"], "automountServiceAccountToken": False}}
        await client.CoreV1Api(self.api).create_namespaced_pod(self.namespace, body)
        self.log.append(f"create pod {name}")

    async def _delete_pod(self, name: str) -> None:
        try:
            await client.CoreV1Api(self.api).delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
        self.log.append(f"delete pod {name}")

    async def _custom(self, group: str, version: str, plural: str) -> list[dict]:
        try:
            got = await client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                group, version, self.namespace, plural)
        except ApiException as e:
            if e.status == 404:
                return []  # the CRD is not installed
            raise
        return list(got.get("items") or [])

    async def _statefulsets(self) -> None:
        sets = await client.AppsV1Api(self.api).list_namespaced_stateful_set(self.namespace)
        pods = {p["metadata"]["name"]: p for p in await self.pods()}
        for s in (self._sanitize(x) for x in sets.items):
            name, want = s["metadata"]["name"], int(s["spec"].get("replicas", 1))
            for i in range(want):
                if f"{name}-{i}" not in pods:
                    await self._create_pod(f"{name}-{i}", s["spec"]["template"],
                                           {"statefulset.kubernetes.io/pod-name": f"{name}-{i}",
                                            "apps.kubernetes.io/pod-index": str(i)})
            mine = [n for n, p in pods.items() if (p["metadata"].get("labels") or {}).get(
                "statefulset.kubernetes.io/pod-name") == n and n.rsplit("-", 1)[0] == name]
            for n in sorted(mine, key=lambda n: -int(n.rsplit("-", 1)[1])):
                if int(n.rsplit("-", 1)[1]) >= want:  # the highest ordinals go first
                    await self._delete_pod(n)

    async def _leaderworkersets(self) -> None:
        name_l, group_l, worker_l = (f"leaderworkerset.sigs.k8s.io/{k}" for k in ("name", "group-index",
                                                                                    "worker-index"))
        pods = await self.pods()
        objs = client.CustomObjectsApi(self.api)
        for s in await self._custom("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"):
            name, want = s["metadata"]["name"], int(s["spec"].get("replicas", 1))
            lwt = s["spec"]["leaderWorkerTemplate"]
            size = int(lwt.get("size", 1))
            mine = {p["metadata"]["name"]: p for p in pods if (p["metadata"].get("labels") or {}).get(name_l) == name}
            for g in range(want):
                for w in range(size):
                    pod_name = f"{name}-{g}" if w == 0 else f"{name}-{g}-{w}"
                    if pod_name in mine:
                        continue
                    template = lwt.get("leaderTemplate") or lwt["workerTemplate"] if w == 0 else lwt["workerTemplate"]
                    await self._create_pod(pod_name, template, {name_l: name, group_l: str(g), worker_l: str(w)},
                                           {"leaderworkerset.sigs.k8s.io/size": str(size)})
            for n, p in sorted(mine.items()):
                if int(p["metadata"]["labels"].get(group_l, "0")) >= want:  # the highest groups, whole
                    await self._delete_pod(n)
            ready = 0
            for g in range(want):
                group = [p for p in mine.values() if p["metadata"]["labels"].get(group_l) == str(g)]
                if len(group) == size and all(any(c.get("type") == "Ready" and c.get("status") == "True"
                                                  for c in (p.get("status") or {}).get("conditions") or [])
                                              for p in group):
                    ready += 1
            status = {"replicas": want, "readyReplicas": ready,
                      "hpaPodSelector": f"{name_l}={name},{worker_l}=0"}
            if s.get("status") != {**(s.get("status") or {}), **status}:
                await objs.patch_namespaced_custom_object_status(
                    "leaderworkerset.x-k8s.io", "v1", self.namespace, "leaderworkersets", name, {"status": status},
                    _content_type="application/merge-patch+json")

    async def _rollouts(self) -> None:
        pods = await self.pods()
        for r in await self._custom("argoproj.io", "v1alpha1", "rollouts"):
            name, want = r["metadata"]["name"], int(r["spec"].get("replicas", 1))
            template = r["spec"].get("template")
            match = (r["spec"].get("selector") or {}).get("matchLabels") or {}
            if template is None:
                continue  # workloadRef: not played here
            mine = [p for p in pods if _selector_matches(match, p["metadata"].get("labels") or {})
                    and not p["metadata"].get("deletionTimestamp")]
            for _ in range(want - len(mine)):
                self._seq += 1
                await self._create_pod(f"{name}-{self._seq}", template, {"rollouts-pod-template-hash": "play"})
            for p in sorted(mine, key=lambda p: -_ts(p["metadata"]["creationTimestamp"]))[: max(len(mine) - want, 0)]:
                await self._delete_pod(p["metadata"]["name"])

    # -- scheduler --------------------------------------------------------------------------------------------
    async def _schedule(self) -> None:
        nodes = await self.nodes()
        pods = await self.pods()
        all_pods = [self._sanitize(p) for p in (await client.CoreV1Api(self.api).list_pod_for_all_namespaces()).items]
        used: dict[str, dict[str, int]] = {}
        for p in all_pods:
            node = p["spec"].get("nodeName")
            if node and p["status"].get("phase") not in ("Succeeded", "Failed"):
                for k, v in _gpu_requests(p["spec"]).items():
                    used.setdefault(node, {})[k] = used.setdefault(node, {}).get(k, 0) + v
        core = client.CoreV1Api(self.api)
        for p in pods:
            if p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp"):
                continue
            need = _gpu_requests(p["spec"])
            for n in sorted(nodes, key=lambda n: n["metadata"]["name"]):
                nname = n["metadata"]["name"]
                if n["spec"].get("unschedulable") or not _tolerates(p["spec"], n["spec"].get("taints") or []):
                    continue
                if not _selector_matches(p["spec"].get("nodeSelector") or {}, n["metadata"].get("labels") or {}):
                    continue
                alloc = (n.get("status") or {}).get("allocatable") or {}
                have = used.get(nname, {})
                if all(int(alloc.get(k, 0)) - have.get(k, 0) >= v for k, v in need.items()):
                    binding = {"apiVersion": "v1", "kind": "Binding",
                               "metadata": {"name": p["metadata"]["name"]},
                               "target": {"apiVersion": "v1", "kind": "Node", "name": nname}}
                    await core.create_namespaced_binding(self.namespace, binding, _preload_content=False)
                    for k, v in need.items():
                        used.setdefault(nname, {})[k] = used.setdefault(nname, {}).get(k, 0) + v
                    self.log.append(f"bind {p['metadata']['name']} -> {nname}")
                    break

    async def _terminate(self) -> None:
        """The kubelet's part of a graceful delete (an eviction): once a terminating pod's grace is over, it is
        gone. Here at the next step: the processes the test stands in for exit on SIGTERM at once."""
        core = client.CoreV1Api(self.api)
        for p in await self.pods():
            if p["metadata"].get("deletionTimestamp"):
                try:
                    await core.delete_namespaced_pod(p["metadata"]["name"], self.namespace, grace_period_seconds=0)
                except ApiException as e:
                    if e.status != 404:
                        raise
                self.log.append(f"terminated {p['metadata']['name']}")

    # -- kubelet ----------------------------------------------------------------------------------------------
    async def _kubelet(self) -> None:
        core = client.CoreV1Api(self.api)
        now = time.time()
        for p in await self.pods():
            if not p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp"):
                continue
            conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
            if conds.get("Ready") == "True":
                continue
            if now - _ts(p["metadata"]["creationTimestamp"]) < self.ready_after_s:
                continue
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
            status: dict[str, Any] = {"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": stamp}]}}
            if self.endpoint_slices:
                status["status"]["podIP"] = self.pod_ip
                status["status"]["podIPs"] = [{"ip": self.pod_ip}]
            await core.patch_namespaced_pod_status(p["metadata"]["name"], self.namespace, status)
            self.log.append(f"ready {p['metadata']['name']}")

    # -- MIG manager ------------------------------------------------------------------------------------------
    async def _mig_manager(self) -> None:
        core = client.CoreV1Api(self.api)
        ns, name = self.mig_configmap
        try:
            cm = await core.read_namespaced_config_map(name, ns)
            configs = yaml.safe_load((cm.data or {}).get("config.yaml") or "{}").get("mig-configs") or {}
        except ApiException as e:
            if e.status != 404:
                raise
            configs = {}
        for n in await self.nodes():
            labels = n["metadata"].get("labels") or {}
            wanted = labels.get(MIG_CONFIG)
            state = labels.get(MIG_STATE)
            applied = (n["metadata"].get("annotations") or {}).get("test.slotwise.io/applied-mig-config")
            if not wanted or wanted == applied or wanted not in configs:
                continue
            nname = n["metadata"]["name"]
            if state != "pending":
                await core.patch_node(nname, {"metadata": {"labels": {MIG_STATE: "pending"}}})
                self.log.append(f"mig pending {nname} {wanted}")
                continue
            if wanted in self.fail_configs:
                done = {"labels": {MIG_STATE: "failed"}, "annotations": {"test.slotwise.io/applied-mig-config": wanted}}
                await core.patch_node(nname, {"metadata": done})
                self.log.append(f"mig failed {nname} {wanted}")
                continue
            count = int(labels.get("nvidia.com/gpu.count", "0"))
            capacity: dict[str, int] = {}
            for entry in configs[wanted]:
                devs = entry.get("devices")
                ndev = count if devs == "all" else len(devs)
                if entry.get("mig-enabled"):
                    for prof, k in (entry.get("mig-devices") or {}).items():
                        capacity[f"nvidia.com/mig-{prof}"] = capacity.get(f"nvidia.com/mig-{prof}", 0) + k * ndev
            status = n.get("status") or {}
            old = {k: v for k, v in (status.get("capacity") or {}).items() if not k.startswith("nvidia.com/mig-")}
            new = {**old, **{k: str(v) for k, v in capacity.items()}}
            # a merge patch would keep profiles that are gone: replace the status' capacity as a whole
            node_obj = await core.read_node(nname)
            node_obj.status.capacity = new
            node_obj.status.allocatable = new
            await core.replace_node_status(nname, node_obj)
            await core.patch_node(nname, {"metadata": {"labels": {MIG_STATE: "success"},
                                                       "annotations": {"test.slotwise.io/applied-mig-config": wanted}}})
            self.log.append(f"mig success {nname} {wanted} {capacity}")


def _ts(stamp: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(stamp.replace(".000000", "")[:19], "%Y-%m-%dT%H:%M:%S")))
