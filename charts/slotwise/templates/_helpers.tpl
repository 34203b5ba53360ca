{{/* Names and labels, the usual Helm shapes. */}}

{{- define "slotwise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slotwise.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "slotwise.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slotwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slotwise.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "slotwise.labels" -}}
helm.sh/chart: {{ include "slotwise.chart" . }}
{{ include "slotwise.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "slotwise.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "slotwise.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "slotwise.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The Lease's namespace, as `slotwise run` resolves it (autoscaler/commands/run.py): the settings' lease_namespace,
but "default" (or unset) is replaced by POD_NAMESPACE, which the Deployment sets to the release namespace.
The lease Role must live there.
*/}}
{{- define "slotwise.leaseNamespace" -}}
{{- $ns := .Values.config.lease_namespace | default "" }}
{{- if or (eq $ns "") (eq $ns "default") }}
{{- .Release.Namespace }}
{{- else }}
{{- $ns }}
{{- end }}
{{- end }}

{{/*
The ConfigMaps the actuator writes, grouped by namespace, as YAML {namespace: [name, ...]}: the time-slicing
ConfigMap when acting (neither dry-run nor report mode), the MIG manager's mig-parted ConfigMap only with
mig_relayout (and acting).
"ns/name", or a bare name in "default" (actuator.split_key).
*/}}
{{- define "slotwise.actuatorConfigMaps" -}}
{{- $act := .Values.config.actuator }}
{{- $refs := list }}
{{- if not (or $act.dry_run $act.report_only) }}
{{- $refs = append $refs $act.time_slicing_configmap }}
{{- if $act.mig_relayout }}
{{- $refs = append $refs $act.mig_parted_configmap }}
{{- end }}
{{- end }}
{{- $byNs := dict }}
{{- range $ref := $refs }}
{{- $parts := splitList "/" $ref }}
{{- $ns := ternary (first $parts) "default" (gt (len $parts) 1) }}
{{- $name := ternary (rest $parts | join "/") $ref (gt (len $parts) 1) }}
{{- $names := get $byNs $ns | default list }}
{{- if not (has $name $names) }}
{{- $_ := set $byNs $ns (append $names $name) }}
{{- end }}
{{- end }}
{{- toYaml $byNs }}
{{- end }}

{{/*
The bind address of /metrics, /healthz, /readyz (listenAddress), refused when it is a loopback address: the
kubelet's probes and Prometheus come to the pod's IP. "podIP": the Deployment passes --listen $(POD_IP):port.
*/}}
{{- define "slotwise.listenAddress" -}}
{{- $addr := .Values.listenAddress | default "0.0.0.0" }}
{{- if or (hasPrefix "127." $addr) (eq $addr "::1") (eq $addr "localhost") (eq $addr "[::1]") }}
{{- fail (printf "listenAddress %s is a loopback address: the kubelet's probes and Prometheus could not reach /healthz, /readyz, /metrics (use 0.0.0.0, :: or podIP)" $addr) }}
{{- end }}
{{- $addr }}
{{- end }}

{{/*
The settings file: .Values.config without empty strings (the controller's defaults apply), plus http_port and
http_host (listenAddress, unless podIP).
Go renders a float such as 1e-06 without a decimal point, which YAML 1.1 (PyYAML) reads as a STRING: such plain
scalars get ".0" in their mantissa (1.0e-06) so the controller reads a number.
*/}}
{{- define "slotwise.settings" -}}
{{- $cfg := dict }}
{{- range $k, $v := .Values.config }}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v ""))) }}
{{- $_ := set $cfg $k $v }}
{{- end }}
{{- end }}
{{- /* prometheus_auth: only what is set (null, "" and the default insecure_skip_verify: false left out); nothing
set: no key at all */}}
{{- $auth := dict }}
{{- range $k, $v := .Values.config.prometheus_auth | default dict }}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v "")) (and (kindIs "bool" $v) (not $v))) }}
{{- $_ := set $auth $k $v }}
{{- end }}
{{- end }}
{{- if $auth }}
{{- $_ := set $cfg "prometheus_auth" $auth }}
{{- else }}
{{- $_ := unset $cfg "prometheus_auth" }}
{{- end }}
{{- /* kv_saturation: false is "off", which the settings file says as null (Helm drops a null value itself) */}}
{{- if and (kindIs "bool" .Values.config.kv_saturation) (not .Values.config.kv_saturation) }}
{{- $_ := set $cfg "kv_saturation" nil }}
{{- end }}
{{- /* limits: left out when empty (the controller's defaults) */}}
{{- if not .Values.config.limits }}
{{- $_ := unset $cfg "limits" }}
{{- end }}
{{- $_ := set $cfg "http_port" (int .Values.listenPort) }}
{{- /* the activator (issue 18): the controller watches its pods (release namespace) and its EndpointSlices */}}
{{- if .Values.activator.enabled }}
{{- $_ := set $cfg "activator_enabled" true }}
{{- $_ := set $cfg "activator_namespace" .Release.Namespace }}
{{- $_ := set $cfg "activator_selector" (include "slotwise.activatorSelector" .) }}
{{- /* who may report: the activator's ServiceAccount (activator.yaml), by its projected token's audience */}}
{{- $_ := set $cfg "activator_service_account" (printf "%s-activator" (include "slotwise.fullname" .)) }}
{{- $_ := set $cfg "activator_token_audience" "slotwise.io/activations" }}
{{- end }}
{{- $addr := include "slotwise.listenAddress" . }}
{{- if ne $addr "podIP" }}
{{- $_ := set $cfg "http_host" $addr }}
{{- end }}
{{- regexReplaceAll "(?m)((?:^|:|-)\\s+-?[0-9]+)([eE][-+]?[0-9]+)$" (toYaml $cfg) "${1}.0${2}" }}
{{- end }}

{{/*
The RBAC rules on the managed models: in the ClusterRole (config.namespace empty: every namespace) or in a Role
in config.namespace (rbac.yaml).
*/}}
{{- define "slotwise.modelRules" }}
{{- $act := .Values.config.actuator }}
{{- $acting := not (or $act.dry_run $act.report_only) }}
# informers: list+watch managed Deployments; the actuator reads one before patching its status annotation
# (not in dry-run) and its pod template (neither in dry-run nor report mode)
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs:
    - get
    - list
    - watch
    {{- if not $act.dry_run }}
    - patch
    {{- end }}
{{- if $acting }}
# ScaleModel: read the scale subresource, replace it with the read resourceVersion
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["get", "update"]
# pod-deletion-cost on the replicas a scale-down removes first
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["patch"]
{{- end }}
{{- if not $act.dry_run }}
# Events on the models' workloads (status, Unplaceable, Preempted, AutoscaledElsewhere); patch bumps the count of a
# repeat
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
# the other scalable workloads a model may be (issue 17): informers (list+watch; LeaderWorkerSet and Rollout are
# optional -- a missing CRD reads as none, a 403 would not), the status annotation and the pod template (patch, as
# for Deployments), the scale subresource (ScaleModel: read, then update/patch with the read resourceVersion)
{{- range $g := list (list "apps" "statefulsets") (list "leaderworkerset.x-k8s.io" "leaderworkersets") (list "argoproj.io" "rollouts") }}
- apiGroups: [{{ index $g 0 | quote }}]
  resources: [{{ index $g 1 | quote }}]
  verbs:
    - get
    - list
    - watch
    {{- if not $act.dry_run }}
    - patch
    {{- end }}
{{- if $acting }}
- apiGroups: [{{ index $g 0 | quote }}]
  resources: ["{{ index $g 1 }}/scale"]
  verbs: ["get", "update", "patch"]
{{- end }}
{{- end }}
# informers: the autoscalers that may already own a workload's /scale (HPA, KEDA ScaledObject) -- read only: slotwise
# never writes them (actuator.coexistence: hands-off or advise)
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch"]
# Dynamic Resource Allocation: a placement on a DRA node is a ResourceClaimTemplate in the model's namespace,
# referenced from its pod template (created and kept up to date when acting)
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs:
    - get
    - list
    - watch
    {{- if $acting }}
    - create
    - update
    - patch
    {{- end }}
{{- end }}

{{/*
The activator's labels. Its own app.kubernetes.io/name (<name>-activator): the controller Deployment's selector
(name + instance) must not match the activator's pods. The controller finds them by activatorSelector.
*/}}
{{- define "slotwise.activatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "slotwise.name" . }}-activator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: activator
{{- end }}

{{- define "slotwise.activatorLabels" -}}
helm.sh/chart: {{ include "slotwise.chart" . }}
{{ include "slotwise.activatorSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "slotwise.activatorSelector" -}}
app.kubernetes.io/name={{ include "slotwise.name" . }}-activator,app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=activator
{{- end }}
