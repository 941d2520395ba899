{{/* Base name of every object of the release. */}}
{{- define "ferrymq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ferrymq.labels" -}}
app.kubernetes.io/name: ferrymq
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ferrymq
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ferrymq.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "ferrymq.controllerName" -}}
{{- printf "%s-controller" (include "ferrymq.fullname" .) -}}
{{- end -}}

{{- define "ferrymq.operatorName" -}}
{{- printf "%s-operator" (include "ferrymq.fullname" .) -}}
{{- end -}}

{{/* The controller's in-cluster URL; brokers and the operator dial it. */}}
{{- define "ferrymq.controllerUrl" -}}
{{- printf "http://%s.%s.svc:%d" (include "ferrymq.controllerName" .) .Release.Namespace (int .Values.controller.port) -}}
{{- end -}}

{{- define "ferrymq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ferrymq.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}
