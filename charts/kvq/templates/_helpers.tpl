{{/* Release-scoped name, at most 63 characters (a DNS label). */}}
{{- define "kvq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvq.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kvq.labels" -}}
{{ include "kvq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kvq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvq.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Peering is only for more than one replica; a single one runs --standalone. */}}
{{- define "kvq.peering" -}}
{{- if gt (int .Values.replicas) 1 -}}{{ include "kvq.fullname" . }}{{- end -}}
{{- end -}}

{{/* The namespaces served: the listed ones, or "" for all. */}}
{{- define "kvq.namespaced" -}}
{{- if .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/*
Rules in every namespace the operator serves: its own kind and status, the engine Pods and
their logs (failure evidence), the kinds it renders, Events, and kopf's namespaced peering.
*/}}
{{- define "kvq.servedRules" -}}
- apiGroups: [kvq.dev]
  resources: [inferenceservices]
  # patch: kopf's annotations and finalizer; kvq never writes spec.
  verbs: [get, list, watch, patch]
- apiGroups: [kvq.dev]
  resources: [inferenceservices/status]
  # kvq replaces status with the resourceVersion it read (a conflict means: decide again).
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
# The kinds kvq renders: server-side apply is a patch (plus create for a new object);
# delete only what it rendered earlier. No update: kvq never replaces them whole.
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# The model cache kvq owns (spec.model.cache.volumeClaim).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create, patch, delete]
# The quality gate (spec.quality): a probe Job per quantized rollout.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
# Autoscaling (spec.autoscaling): the KEDA ScaledObject kvq renders for a service.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, watch, create, patch, delete]
# Routing (spec.routing): the HTTPRoute and the inference extension's InferencePools.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, list, watch, create, patch, delete]
# A replica over several nodes (gpusPerReplica above a node's GPUs): a LeaderWorkerSet
# (its controller, when installed, makes the StatefulSets and pods itself).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if and (include "kvq.peering" .) (include "kvq.namespaced" .) }}
# kopf watches the whole collection, but writes only its own peering object.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [list, watch]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  resourceNames: [{{ include "kvq.peering" . }}]
  verbs: [get, patch]
{{- end }}
{{- end -}}
