"""The Kubernetes adapters (kubernetes_asyncio): what the live controller observes and how it acts.

| module | role |
|---|---|
| ``objects.py`` | label/annotation names, ``ManagedModel``, ``NodeInfo``, ``ClusterView`` |
| ``informer.py`` | list+watch caches of any resource (resourceVersion, 410 re-list, jittered backoff) |
| ``translate.py`` | pure: cached Deployments, Pods, Nodes, training workloads -> ``ClusterView`` (``build_view``) |
| ``fields.py`` | pure readers of single fields (times, counts, grace periods, conditions, owner references) |
| ``selector.py`` | label selectors (matchLabels, matchExpressions), as the API server evaluates them |
| ``gpu_nodes.py`` | what a GPU node offers (GFD labels, device-plugin capacity, MIG), what pods ask and take |
| ``pods.py`` | the live (not terminal) pods of one view, oldest first |
| ``training.py`` | preemptible training Jobs, Kueue Workloads and Pods -> ``TrainingWorkload`` + ``TrainingRef`` |
| ``leader.py`` | leader election on a ``coordination.k8s.io/v1`` Lease |
| ``actuator.py`` | applies a plan: scale subresource, templates, time-slicing ConfigMap, status, Events |
| ``writes.py`` | pure: what the actuators write (status annotation, Event texts, merged resources and configs) |
| ``lending.py`` | applies ``LendGpus`` / ``ReclaimGpus``: node lending, reclaims across ticks, Kueue lendingLimit |
| ``lending_rules.py`` | pure: which pods may be evicted and in what order, node patches, the lendingLimit |
| ``mig_gate.py`` | the MIG re-layout safety gate (cordon, wait free, relabel, wait success, uncordon) |
"""
