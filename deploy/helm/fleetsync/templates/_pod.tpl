{{/* The daemon's flags, as a YAML list of strings (see docs/configuration.md). */}}
{{- define "fleetsync.args" -}}
- {{ print "--cluster-id=" .Values.clusterID | toJson }}
- {{ print "--default-sync=" .Values.sync.defaultSync | toJson }}
- {{ print "--allow-namespace=" (join "," .Values.sync.allowNamespaces) | toJson }}
- {{ print "--deny-namespace=" (join "," .Values.sync.denyNamespaces) | toJson }}
- {{ print "--window=" .Values.sync.window | toJson }}
- {{ print "--service-prefix=" .Values.sync.servicePrefix | toJson }}
- {{ print "--add-namespace-suffix=" .Values.sync.addNamespaceSuffix | toJson }}
- {{ print "--k8s-tag=" .Values.sync.k8sTag | toJson }}
- {{ print "--terminating=" .Values.sync.terminating | toJson }}
- {{ print "--register-not-ready=" .Values.sync.registerNotReady | toJson }}
- {{ print "--node-port-sync-type=" .Values.sync.nodePortSyncType | toJson }}
- {{ print "--sync-clusterip-services=" .Values.sync.syncClusterIPServices | toJson }}
- {{ print "--sync-lb-services-endpoints=" .Values.sync.syncLoadBalancerEndpoints | toJson }}
- {{ print "--enable-ingress=" .Values.sync.ingress.enabled | toJson }}
- {{ print "--loadbalancer-ips=" .Values.sync.ingress.loadBalancerIPs | toJson }}
- {{ print "--consul-k8s-meta=" .Values.sync.consulK8sMeta | toJson }}
- {{ print "--consul-max-writes-per-second=" .Values.writeBudget.maxWritesPerSecond | toJson }}
- {{ print "--consul-write-burst=" (int .Values.writeBudget.burst) | toJson }}
- {{ print "--consul-max-inflight=" (int .Values.writeBudget.maxInflight) | toJson }}
- {{ print "--consul-nodes=" (int .Values.consul.nodes) | toJson }}
- {{ print "--metrics-per-worker=" .Values.metrics.perWorker | toJson }}
- {{ print "--http-addr=:" (int .Values.httpPort) | toJson }}
- {{ print "--shutdown-timeout=" .Values.shutdownTimeout | toJson }}
- {{ print "--log-level=" .Values.log.level | toJson }}
- {{ print "--log-json=" .Values.log.json | toJson }}
{{- include "fleetsync.consulArgs" . }}
{{- include "fleetsync.toK8sArgs" . }}
{{- if include "fleetsync.sharded" . }}
- {{ print "--shards=" (int .Values.shards) | toJson }}
- {{ print "--lease-namespace=" .Release.Namespace | toJson }}
- "--replica-id=$(POD_NAME)"
{{- with .Values.leaseDuration }}
- {{ print "--lease-duration=" . | toJson }}
{{- end }}
{{- with .Values.leaseRenewDeadline }}
- {{ print "--lease-renew-deadline=" . | toJson }}
{{- end }}
{{- with .Values.leaseRetryPeriod }}
- {{ print "--lease-retry-period=" . | toJson }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | toJson }}
{{- end }}
{{- end -}}

{{/* The Consul -> Kubernetes flags, when either mode is on. */}}
{{- define "fleetsync.toK8sArgs" -}}
{{- with .Values.toK8s }}
{{- if or .enabled .import }}
- {{ print "--to-k8s=" .enabled | toJson }}
- {{ print "--to-k8s-import=" .import | toJson }}
- {{ print "--to-k8s-mode=" .mode | toJson }}
{{- with .consulDomain }}
- {{ print "--consul-domain=" . | toJson }}
{{- end }}
{{- if .adoptConsulK8s }}
- "--to-k8s-adopt-consul-k8s=true"
{{- end }}
- {{ print "--k8s-write-namespace=" (include "fleetsync.toK8sNamespace" $) | toJson }}
- {{ print "--k8s-service-prefix=" .servicePrefix | toJson }}
{{- with .allow }}
- {{ print "--to-k8s-allow=" (join "," .) | toJson }}
{{- end }}
{{- with .deny }}
- {{ print "--to-k8s-deny=" (join "," .) | toJson }}
{{- end }}
- {{ print "--to-k8s-exclude-tag=" .excludeTag | toJson }}
- {{ print "--to-k8s-require-tag=" .requireTag | toJson }}
- {{ print "--to-k8s-filter=" .filter | toJson }}
{{- with .includeClusters }}
- {{ print "--to-k8s-include-clusters=" (join "," .) | toJson }}
{{- end }}
- {{ print "--to-k8s-warning=" .warning | toJson }}
- {{ print "--to-k8s-critical=" .critical | toJson }}
- {{ print "--to-k8s-address=" .address | toJson }}
- {{ print "--to-k8s-window=" .window | toJson }}
- {{ print "--to-k8s-qps=" .qps | toJson }}
- {{ print "--to-k8s-burst=" (int .burst) | toJson }}
{{- if not (kindIs "invalid" .maxWatches) }}
- {{ print "--to-k8s-max-watches=" (int .maxWatches) | toJson }}
{{- end }}
- {{ print "--to-k8s-poll-interval=" .pollInterval | toJson }}
- {{ print "--to-k8s-deletion-grace=" .deletionGrace | toJson }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The pod's name (the replica id in the shard Leases, --replica-id) and
namespace (the daemon's default lease namespace), then Consul's own
variables: the address, and the mounted token, CA and client cert.
Variables rather than flags, so that `fleetsync status` and `purge` run in
the pod (kubectl exec) reach the same Consul. */}}
{{- define "fleetsync.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
- name: CONSUL_HTTP_ADDR
  value: {{ .Values.consul.address | toJson }}
{{- with .Values.consul.tlsServerName }}
- name: CONSUL_TLS_SERVER_NAME
  value: {{ . | toJson }}
{{- end }}
{{- if .Values.consul.tokenSecret.name }}
- name: CONSUL_HTTP_TOKEN_FILE
  value: /etc/fleetsync/consul-token/token
{{- end }}
{{- if or .Values.consul.ca.secretName .Values.consul.ca.configMapName }}
- name: CONSUL_CACERT
  value: /etc/fleetsync/consul-ca/ca.crt
{{- end }}
{{- if .Values.consul.clientCertSecret }}
- name: CONSUL_CLIENT_CERT
  value: /etc/fleetsync/consul-client/tls.crt
- name: CONSUL_CLIENT_KEY
  value: /etc/fleetsync/consul-client/tls.key
{{- end }}
{{- end -}}

{{- define "fleetsync.volumeMounts" -}}
{{- if .Values.consul.tokenSecret.name }}
- name: consul-token
  mountPath: /etc/fleetsync/consul-token
  readOnly: true
{{- end }}
{{- if or .Values.consul.ca.secretName .Values.consul.ca.configMapName }}
- name: consul-ca
  mountPath: /etc/fleetsync/consul-ca
  readOnly: true
{{- end }}
{{- if .Values.consul.clientCertSecret }}
- name: consul-client
  mountPath: /etc/fleetsync/consul-client
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "fleetsync.volumes" -}}
{{- if .Values.consul.tokenSecret.name }}
- name: consul-token
  secret:
    secretName: {{ .Values.consul.tokenSecret.name }}
    defaultMode: 0440
    items:
      - key: {{ .Values.consul.tokenSecret.key }}
        path: token
{{- end }}
{{- if .Values.consul.ca.secretName }}
- name: consul-ca
  secret:
    secretName: {{ .Values.consul.ca.secretName }}
    items:
      - key: {{ .Values.consul.ca.key }}
        path: ca.crt
{{- else if .Values.consul.ca.configMapName }}
- name: consul-ca
  configMap:
    name: {{ .Values.consul.ca.configMapName }}
    items:
      - key: {{ .Values.consul.ca.key }}
        path: ca.crt
{{- end }}
{{- if .Values.consul.clientCertSecret }}
- name: consul-client
  secret:
    secretName: {{ .Values.consul.clientCertSecret }}
    defaultMode: 0440
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Consul access beyond the CONSUL_* variables: more addresses, the
datacenter, Enterprise namespaces and partitions, the login. */}}
{{- define "fleetsync.consulArgs" -}}
{{- with .Values.consul.extraAddresses }}
- {{ print "--consul-address=" (join "," (prepend . $.Values.consul.address)) | toJson }}
{{- end }}
{{- with .Values.consul.datacenter }}
- {{ print "--consul-datacenter=" . | toJson }}
{{- end }}
{{- with .Values.consul.namespace }}
- {{ print "--consul-namespace=" . | toJson }}
{{- end }}
{{- with .Values.consul.partition }}
- {{ print "--consul-partition=" . | toJson }}
{{- end }}
{{- if .Values.consul.enableNamespaces }}
- "--enable-namespaces=true"
{{- end }}
{{- if not (kindIs "invalid" .Values.consul.mirrorK8sNamespaces) }}
- {{ print "--enable-k8s-namespace-mirroring=" .Values.consul.mirrorK8sNamespaces | toJson }}
{{- end }}
{{- if include "fleetsync.mirrorNamespaces" . }}
{{- with .Values.consul.mirrorK8sNamespacesPrefix }}
- {{ print "--k8s-namespace-mirroring-prefix=" . | toJson }}
{{- end }}
{{- end }}
{{- with .Values.consul.crossNamespaceACLPolicy }}
- {{ print "--consul-cross-namespace-acl-policy=" . | toJson }}
{{- end }}
{{- with .Values.consul.login }}
{{- if .enabled }}
- {{ print "--consul-login-auth-method=" .authMethod | toJson }}
{{- with .datacenter }}
- {{ print "--consul-login-datacenter=" . | toJson }}
{{- end }}
{{- with .bearerTokenFile }}
- {{ print "--consul-login-bearer-token-file=" . | toJson }}
{{- end }}
{{- range $k, $v := .meta }}
- {{ printf "--consul-login-meta=%s=%s" $k $v | toJson }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
