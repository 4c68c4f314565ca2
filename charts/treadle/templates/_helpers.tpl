{{- define "treadle.fullname" -}}
{{- printf "%s-treadle" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "treadle.labels" -}}
app.kubernetes.io/name: treadle
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "treadle.operatorSelector" -}}
app.kubernetes.io/name: treadle
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "treadle.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else -}}
{{- printf "%s-operator" (include "treadle.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "treadle.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis.%s.svc:6379/0" (include "treadle.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{- /* The Secret holding the operator's key (every job's token and Redis password derive from it)
and the shared Redis's admin password: the values' when given, else the ones already in the
cluster (lookup, so an upgrade keeps them), else new random ones. */ -}}
{{- define "treadle.authSecret" -}}
{{- printf "%s-auth" (include "treadle.fullname" .) -}}
{{- end -}}

{{- define "treadle.redisPassword" -}}
{{- $old := lookup "v1" "Secret" .Release.Namespace (include "treadle.authSecret" .) -}}
{{- if .Values.redis.password -}}
{{- .Values.redis.password -}}
{{- else if and $old (index ($old.data | default dict) "redis-password") -}}
{{- index $old.data "redis-password" | b64dec -}}
{{- else if .Values.redis.enabled -}}
{{- randAlphaNum 40 -}}
{{- end -}}
{{- end -}}

{{- define "treadle.authKey" -}}
{{- $old := lookup "v1" "Secret" .Release.Namespace (include "treadle.authSecret" .) -}}
{{- if .Values.auth.key -}}
{{- .Values.auth.key -}}
{{- else if and $old (index ($old.data | default dict) "auth-key") -}}
{{- index $old.data "auth-key" | b64dec -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}

{{- define "treadle.mooncakeMaster" -}}
{{- if .Values.mooncake.enabled -}}
{{- printf "%s-mooncake.%s.svc:50051" (include "treadle.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- required "mooncake.externalMaster is required when mooncake.enabled is false" .Values.mooncake.externalMaster -}}
{{- end -}}
{{- end -}}

{{- define "treadle.mooncakeMetadataUrl" -}}
{{- if .Values.mooncake.enabled -}}
{{- printf "http://%s-mooncake.%s.svc:8080/metadata" (include "treadle.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.mooncake.externalMetadataUrl -}}
{{- end -}}
{{- end -}}

{{- /* A chart pod's placement: the component's nodeSelector, tolerations and affinity where set,
else cpuPlacement's (by default off GPU nodes). Called with (dict "root" $ "component" .Values.X). */ -}}
{{- define "treadle.placement" -}}
{{- $default := .root.Values.cpuPlacement -}}
{{- with (.component.nodeSelector | default $default.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.component.tolerations | default $default.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.component.affinity | default $default.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The namespaces a namespaced operator watches, as a JSON list; an empty list without clusterWide
would leave the operator watching nothing, so it fails the install naming both values.
*/}}
{{- define "treadle.watchNamespaces" -}}
{{- if and (not .Values.operator.clusterWide) (not .Values.operator.watchNamespaces) -}}
{{- fail "operator.watchNamespaces: list at least one namespace whose RolloutJobs the operator reconciles, or set operator.clusterWide=true" -}}
{{- end -}}
{{- .Values.operator.watchNamespaces | default list | toJson -}}
{{- end -}}
