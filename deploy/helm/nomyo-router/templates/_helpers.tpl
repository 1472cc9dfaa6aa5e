{{- define "nomyo-router.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nomyo-router.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nomyo-router.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nomyo-router.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nomyo-router.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "nomyo-router.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "nomyo-router.secretName" -}}
{{- default (include "nomyo-router.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{- define "nomyo-router.clientLabels" -}}
{{- toYaml (.Values.networkPolicy.clientLabels | default (dict "nomyo-router/client" "true")) -}}
{{- end -}}
