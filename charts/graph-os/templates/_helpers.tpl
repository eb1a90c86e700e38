{{- define "graph-os.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "graph-os.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "graph-os.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Secret holding the bearer tokens: the existing one, else the generated one (if generated). */}}
{{- define "graph-os.tokenSecret" -}}
{{- if .Values.tokens.existingSecret -}}
{{ .Values.tokens.existingSecret }}
{{- else if and .Values.tokens.generate (not .Values.auth.oauth.issuer) (not .Values.auth.allowUnauthenticated) -}}
{{ include "graph-os.fullname" . }}-tokens
{{- end -}}
{{- end -}}

{{/* The bundled Valkey's name. */}}
{{- define "graph-os.valkey" -}}
{{ include "graph-os.fullname" . | trunc 56 | trimSuffix "-" }}-valkey
{{- end -}}

{{/* Checks the session store values; renders nothing. */}}
{{- define "graph-os.sessionStoreCheck" -}}
{{- with .Values.sessionStore -}}
{{- if eq .type "redis" -}}
{{- if and .redis.existingSecret .redis.bundled.enabled -}}
{{- fail "sessionStore.redis: set existingSecret or bundled.enabled, not both" -}}
{{- end -}}
{{- if not (or .redis.existingSecret .redis.bundled.enabled) -}}
{{- fail "sessionStore.type redis needs sessionStore.redis.existingSecret (a Secret with the URL) or sessionStore.redis.bundled.enabled" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The gateway image: repository:tag, the default tag being appVersion[-variant]. */}}
{{- define "graph-os.image" -}}
{{- $tag := .Values.image.tag -}}
{{- if not $tag -}}
{{- $tag = .Chart.AppVersion -}}
{{- if .Values.image.variant }}{{ $tag = printf "%s-%s" $tag .Values.image.variant }}{{ end -}}
{{- end -}}
{{ printf "%s:%s" .Values.image.repository $tag }}
{{- end -}}

{{/* "true" when more than one gateway replica may run (replicaCount, or the HPA's maxReplicas). */}}
{{- define "graph-os.multiReplica" -}}
{{- if .Values.autoscaling.enabled -}}
{{- if gt (int .Values.autoscaling.maxReplicas) 1 }}true{{ end -}}
{{- else if gt (int .Values.replicaCount) 1 }}true{{ end -}}
{{- end -}}

{{/* The scopes whose token the Secret holds (tokens.keys entries that are not ""), space separated. */}}
{{- define "graph-os.tokenScopes" -}}
{{- $scopes := list -}}
{{- range list "manage" "delegate" "discover" -}}
{{- if index $.Values.tokens.keys . }}{{ $scopes = append $scopes . }}{{ end -}}
{{- end -}}
{{ join " " $scopes }}
{{- end -}}

{{/* Whether a ServiceMonitor is rendered: enabled and the cluster serves the kind. */}}
{{- define "graph-os.serviceMonitor" -}}
{{- if and .Values.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") }}true{{ end -}}
{{- end -}}

{{/* The `helm test` pod's labels (distinct from the gateway's selector). */}}
{{- define "graph-os.testSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end -}}
