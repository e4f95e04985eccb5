{{/* Name of the chart, overridable with nameOverride. */}}
{{- define "fleetsync.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects. */}}
{{- define "fleetsync.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "fleetsync.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "fleetsync.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetsync.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetsync.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetsync.labels" -}}
{{ include "fleetsync.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Whether the replicas split the Services through shard Leases. */}}
{{- define "fleetsync.sharded" -}}
{{- if gt (int .Values.shards) 1 }}true{{ end -}}
{{- end -}}

{{- define "fleetsync.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fleetsync.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Fails rendering with a clear message when a value is unusable. */}}
{{- define "fleetsync.validate" -}}
{{- $id := required "clusterID is required: a DNS label naming this Kubernetes cluster in Consul (e.g. --set clusterID=prod-eu-1)" .Values.clusterID -}}
{{- if not (regexMatch "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$" $id) -}}
{{- fail (printf "clusterID %q is invalid: it must be a DNS label (1-63 characters: lowercase letters, digits and '-', starting and ending with a letter or digit)" $id) -}}
{{- end -}}
{{- $_ := required "consul.address is required: the Consul HTTP API, host:port or https://host:port" .Values.consul.address -}}
{{- if .Values.consul.login.enabled -}}
{{- $_ := required "consul.login.authMethod is required with consul.login.enabled: the Consul auth method to log in with (consul-k8s: <release>-consul-k8s-component-auth-method)" .Values.consul.login.authMethod -}}
{{- if .Values.consul.tokenSecret.name -}}
{{- fail "consul.login.enabled and consul.tokenSecret.name: set one (the login token replaces the static one)" -}}
{{- end -}}
{{- end -}}
{{- if and (include "fleetsync.mirrorNamespaces" .) .Values.consul.namespace (ne .Values.consul.namespace "default") -}}
{{- if kindIs "invalid" .Values.consul.mirrorK8sNamespaces -}}
{{- fail "consul.enableNamespaces and consul.namespace: mirroring is on by default with enableNamespaces (as the consul chart's mirroringK8S); set consul.mirrorK8sNamespaces: false to put every instance in consul.namespace" -}}
{{- end -}}
{{- fail "consul.mirrorK8sNamespaces and consul.namespace: set one (mirroring names each instance's namespace after its Kubernetes namespace)" -}}
{{- end -}}
{{- if and .Values.consul.ca.secretName .Values.consul.ca.configMapName -}}
{{- fail "consul.ca: set secretName or configMapName, not both" -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (le (int .Values.shards) 1) -}}
{{- fail (printf "replicas=%d needs shards > 1: with shards 1 every replica syncs every Service (hot standbys that all write); set shards >= replicas so that they split the Services (e.g. shards=%d), or replicas=1" (int .Values.replicas) (mul 4 (int .Values.replicas))) -}}
{{- end -}}
{{- end -}}

{{/* A scheduling value (nodeSelector, tolerations, affinity) as YAML: a
map or list as it is, or a string of YAML rendered with tpl, as the consul
chart takes its syncCatalog values (so its values can be copied). Call with
(dict "value" .Values.x "root" $). */}}
{{- define "fleetsync.yamlValue" -}}
{{- if kindIs "string" .value -}}
{{ tpl .value .root }}
{{- else -}}
{{ toYaml .value }}
{{- end -}}
{{- end -}}

{{/* The namespace of the mirrored Services (--k8s-write-namespace). */}}
{{- define "fleetsync.toK8sNamespace" -}}
{{- default .Release.Namespace .Values.toK8s.writeNamespace -}}
{{- end -}}

{{/* "true" when instances go in their Kubernetes namespace's mirror:
consul.mirrorK8sNamespaces when set, else consul.enableNamespaces (the
binary's --enable-k8s-namespace-mirroring default); "" otherwise. */}}
{{- define "fleetsync.mirrorNamespaces" -}}
{{- if kindIs "invalid" .Values.consul.mirrorK8sNamespaces -}}
{{- if .Values.consul.enableNamespaces }}true{{ end -}}
{{- else if .Values.consul.mirrorK8sNamespaces }}true{{ end -}}
{{- end -}}
