{{/* Names and labels. */}}
{{- define "toolsidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "toolsidecar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "toolsidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "toolsidecar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "toolsidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "toolsidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "toolsidecar.selector" -}}
app.kubernetes.io/name: {{ include "toolsidecar.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image: no default repository, since none is published; a digest pins it. */}}
{{- define "toolsidecar.image" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository: set it to the registry you pushed the image of `make image` to (docs/kubernetes.md, \"The image\"), and image.digest to pin it" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The keys of a dict whose value is set, as YAML: a null leaves its key to the daemon's default. */}}
{{- define "toolsidecar.setKeys" -}}
{{- $set := dict -}}
{{- range $k, $v := . -}}
{{- if not (kindIs "invalid" $v) -}}{{- $_ := set $set $k $v -}}{{- end -}}
{{- end -}}
{{- with $set }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* The NATS client settings, shared by the sidecar's and the workers' config.yaml. */}}
{{- define "toolsidecar.natsClient" -}}
url: {{ .Values.nats.url | quote }}
subject_prefix: {{ .Values.nats.subjectPrefix }}
{{- if .Values.nats.credsSecret.name }}
creds_file: /var/run/secrets/toolsidecar/nats/{{ .Values.nats.credsSecret.key }}
{{- end }}
{{- include "toolsidecar.tlsFiles" (dict "tls" .Values.nats.tls "volume" "nats-tls") }}
{{- end -}}

{{/* A tls section whose files come from a Secret mounted as the given volume (toolsidecar.secretVolume). */}}
{{- define "toolsidecar.tlsFiles" -}}
{{- with .tls }}
{{- if .secretName }}
tls:
  ca_file: /var/run/secrets/toolsidecar/{{ $.volume }}/{{ .caKey }}
  {{- if .certKey }}
  cert_file: /var/run/secrets/toolsidecar/{{ $.volume }}/{{ .certKey }}
  key_file: /var/run/secrets/toolsidecar/{{ $.volume }}/{{ .keyKey }}
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The sidecar's config.yaml. Secrets are files, never values. */}}
{{- define "toolsidecar.config" -}}
durability:
  enabled: {{ .Values.durability.enabled }}
  replicas: {{ .Values.durability.replicas }}
  lease_ttl: {{ .Values.durability.leaseTTL }}
  {{- with include "toolsidecar.setKeys" (dict "max_bytes" .Values.durability.maxBytes) }}{{ . | nindent 2 }}{{ end }}
upstream:
  kind: {{ .Values.upstream.kind }}
  url: {{ .Values.upstream.url | quote }}
  {{- if .Values.upstream.apiKeySecret.name }}
  api_key_file: /var/run/secrets/toolsidecar/upstream/{{ .Values.upstream.apiKeySecret.key }}
  {{- end }}
  {{- if .Values.upstream.webhookSecret.name }}
  webhook_secret_file: /var/run/secrets/toolsidecar/webhook/{{ .Values.upstream.webhookSecret.key }}
  {{- end }}
  {{- with .Values.upstream }}
  {{- with include "toolsidecar.setKeys" (dict "retry_budget" .retryBudget "connect_timeout" .connectTimeout "stream_idle_timeout" .streamIdleTimeout
    "journal_ttl" .journalTTL "max_sessions" .maxSessions "max_sessions_per_owner" .maxSessionsPerOwner "confirmations" .confirmations) }}{{ . | nindent 2 }}{{ end }}
  {{- end }}
core:
  url: {{ .Values.core.url | quote }}
  {{- if .Values.core.apiKeySecret.name }}
  api_key_file: /var/run/secrets/toolsidecar/core/{{ .Values.core.apiKeySecret.key }}
  {{- end }}
  timeout: {{ .Values.core.timeout }}
  stream_idle_timeout: {{ .Values.core.streamIdleTimeout }}
  readiness_check: {{ .Values.core.readinessCheck }}
  max_connections: {{ .Values.core.maxConnections }}
  idle_timeout: {{ .Values.core.idleTimeout }}
  {{- with include "toolsidecar.setKeys" (dict "connect_timeout" .Values.core.connectTimeout) }}{{ . | nindent 2 }}{{ end }}
  {{- if .Values.core.tls.secretName }}
  {{- include "toolsidecar.tlsFiles" (dict "tls" .Values.core.tls "volume" "core-tls") | trim | nindent 2 }}
  {{- end }}
nats:
  {{- include "toolsidecar.natsClient" . | nindent 2 }}
  {{- with .Values.nats }}
  {{- with include "toolsidecar.setKeys" (dict "connect_retry" .connectRetry "discover_interval" .discoverInterval "discover_grace" .discoverGrace
    "discover_allow" .discoverAllow) }}{{ . | nindent 2 }}{{ end }}
  {{- end }}
  embedded:
    listen: {{ .Values.nats.embedded.listen | quote }}
    allow_anonymous: {{ .Values.nats.embedded.allowAnonymous }}
    worker_credentials: {{ .Values.nats.embedded.workerCredentials.enabled }}
    {{- if (include "toolsidecar.workerCredentials" .) }}
    worker_credentials_file: {{ printf "%s/worker-credentials.json" .Values.nats.embedded.workerCredentials.mountPath | quote }}
    {{- end }}
    {{- if (include "toolsidecar.embeddedStore" .) }}
    store_dir: {{ .Values.nats.embedded.storeDir | quote }}
    {{- end }}
    sync: {{ .Values.nats.embedded.sync | quote }}
    {{- with .Values.nats.embedded.workers }}
    workers:
      {{- toYaml . | nindent 6 }}
    {{- end }}
server:
  # The API stays inside the pod; probes and scrapers use the ops port.
  listen: {{ printf "127.0.0.1:%d" (int .Values.sidecar.port) | quote }}
  ops_listen: {{ printf "0.0.0.0:%d" (int .Values.sidecar.opsPort) | quote }}
  proxy: {{ .Values.sidecar.proxy }}
  {{- if .Values.sidecar.authTokenSecret.name }}
  auth_token_file: /var/run/secrets/toolsidecar/token/{{ .Values.sidecar.authTokenSecret.key }}
  {{- end }}
  {{- if .Values.sidecar.operatorTokenSecret.name }}
  operator_token_file: /var/run/secrets/toolsidecar/operator/{{ .Values.sidecar.operatorTokenSecret.key }}
  {{- end }}
  shutdown_timeout: {{ .Values.sidecar.shutdownTimeout }}
  max_drives: {{ .Values.sidecar.maxDrives }}
  http2_cleartext: {{ .Values.sidecar.http2Cleartext }}
  ui: {{ .Values.sidecar.ui }}
  {{- with .Values.sidecar }}
  {{- with include "toolsidecar.setKeys" (dict "mcp" .mcp "allowed_hosts" .allowedHosts "ui_trace_url" .uiTraceURL "ui_history" .uiHistory
    "pprof" .pprof "idle_timeout" .idleTimeout "max_body_bytes" .maxBodyBytes "max_connections" .maxConnections
    "max_header_bytes" .maxHeaderBytes "max_streams" .maxStreams "read_header_timeout" .readHeaderTimeout
    "read_timeout" .readTimeout "sse_keepalive" .sseKeepalive "sse_resume_grace" .sseResumeGrace) }}{{ . | nindent 2 }}{{ end }}
  {{- end }}
executor:
  max_turns: {{ .Values.executor.maxTurns }}
  max_parallel: {{ .Values.executor.maxParallel }}
  missing_tool: {{ .Values.executor.missingTool }}
  {{- with .Values.executor }}
  {{- with include "toolsidecar.setKeys" (dict "max_args_bytes" .maxArgsBytes "max_result_bytes" .maxResultBytes "max_error_bytes" .maxErrorBytes
    "max_exec_processes" .maxExecProcesses "cancel_poll" .cancelPoll "cancel_poll_rps" .cancelPollRPS "submit_budget" .submitBudget
    "lanes" .lanes "claim_check_bytes" .claimCheckBytes "claim_check_preview_bytes" .claimCheckPreviewBytes "max_hedge_ratio" .maxHedgeRatio) }}{{ . | nindent 2 }}{{ end }}
  {{- with .runBudget }}
  {{- with include "toolsidecar.setKeys" (dict "max_calls" .maxCalls "max_tool_time" .maxToolTime "max_result_bytes" .maxResultBytes "on_budget" .onBudget) }}
  run_budget:
    {{- . | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- end }}
tracing:
  otlp_endpoint: {{ .Values.tracing.otlpEndpoint | quote }}
  insecure: {{ .Values.tracing.insecure }}
  sample_ratio: {{ .Values.tracing.sampleRatio }}
  {{- with include "toolsidecar.setKeys" (dict "service_name" .Values.tracing.serviceName) }}{{ . | nindent 2 }}{{ end }}
tools:
{{- toYaml .Values.tools | nindent 2 }}
{{- end -}}

{{/* The workers' config.yaml. */}}
{{- define "toolsidecar.workerConfig" -}}
nats:
  {{- include "toolsidecar.natsClient" . | nindent 2 }}
server:
  ops_listen: {{ printf "0.0.0.0:%d" (int .Values.workers.opsPort) | quote }}
tools:
{{- toYaml .Values.workers.tools | nindent 2 }}
{{- end -}}

{{/* The NATS secrets as volumes and mounts, shared by the sidecar and the workers. */}}
{{- define "toolsidecar.natsVolumes" -}}
{{- if .Values.nats.credsSecret.name }}
- name: nats-creds
  secret:
    secretName: {{ .Values.nats.credsSecret.name }}
    items: [{ key: {{ .Values.nats.credsSecret.key }}, path: {{ .Values.nats.credsSecret.key }} }]
{{- end }}
{{- if .Values.nats.tls.secretName }}
- name: nats-tls
  secret:
    secretName: {{ .Values.nats.tls.secretName }}
{{- end }}
{{- end -}}

{{- define "toolsidecar.natsMounts" -}}
{{- if .Values.nats.credsSecret.name }}
- { name: nats-creds, mountPath: /var/run/secrets/toolsidecar/nats, readOnly: true }
{{- end }}
{{- if .Values.nats.tls.secretName }}
- { name: nats-tls, mountPath: /var/run/secrets/toolsidecar/nats-tls, readOnly: true }
{{- end }}
{{- end -}}

{{/* The sidecar's secret-backed volumes and mounts. */}}
{{- define "toolsidecar.secretVolumes" -}}
{{- if .Values.core.apiKeySecret.name }}
- name: core-api-key
  secret:
    secretName: {{ .Values.core.apiKeySecret.name }}
    items: [{ key: {{ .Values.core.apiKeySecret.key }}, path: {{ .Values.core.apiKeySecret.key }} }]
{{- end }}
{{- include "toolsidecar.natsVolumes" . }}
{{- if .Values.core.tls.secretName }}
- name: core-tls
  secret:
    secretName: {{ .Values.core.tls.secretName }}
{{- end }}
{{- if .Values.sidecar.authTokenSecret.name }}
- name: auth-token
  secret:
    secretName: {{ .Values.sidecar.authTokenSecret.name }}
    items: [{ key: {{ .Values.sidecar.authTokenSecret.key }}, path: {{ .Values.sidecar.authTokenSecret.key }} }]
{{- end }}
{{- if .Values.sidecar.operatorTokenSecret.name }}
- name: operator-token
  secret:
    secretName: {{ .Values.sidecar.operatorTokenSecret.name }}
    items: [{ key: {{ .Values.sidecar.operatorTokenSecret.key }}, path: {{ .Values.sidecar.operatorTokenSecret.key }} }]
{{- end }}
{{- if .Values.upstream.apiKeySecret.name }}
- name: upstream-api-key
  secret:
    secretName: {{ .Values.upstream.apiKeySecret.name }}
    items: [{ key: {{ .Values.upstream.apiKeySecret.key }}, path: {{ .Values.upstream.apiKeySecret.key }} }]
{{- end }}
{{- if .Values.upstream.webhookSecret.name }}
- name: upstream-webhook-secret
  secret:
    secretName: {{ .Values.upstream.webhookSecret.name }}
    items: [{ key: {{ .Values.upstream.webhookSecret.key }}, path: {{ .Values.upstream.webhookSecret.key }} }]
{{- end }}
{{- end -}}

{{- define "toolsidecar.secretMounts" -}}
{{- if .Values.core.apiKeySecret.name }}
- { name: core-api-key, mountPath: /var/run/secrets/toolsidecar/core, readOnly: true }
{{- end }}
{{- include "toolsidecar.natsMounts" . }}
{{- if .Values.core.tls.secretName }}
- { name: core-tls, mountPath: /var/run/secrets/toolsidecar/core-tls, readOnly: true }
{{- end }}
{{- if .Values.sidecar.authTokenSecret.name }}
- { name: auth-token, mountPath: /var/run/secrets/toolsidecar/token, readOnly: true }
{{- end }}
{{- if .Values.sidecar.operatorTokenSecret.name }}
- { name: operator-token, mountPath: /var/run/secrets/toolsidecar/operator, readOnly: true }
{{- end }}
{{- if .Values.upstream.apiKeySecret.name }}
- { name: upstream-api-key, mountPath: /var/run/secrets/toolsidecar/upstream, readOnly: true }
{{- end }}
{{- if .Values.upstream.webhookSecret.name }}
- { name: upstream-webhook-secret, mountPath: /var/run/secrets/toolsidecar/webhook, readOnly: true }
{{- end }}
{{- end -}}

{{/* Non-empty when the embedded server keeps JetStream files: durable mode without an external NATS. */}}
{{/* Whether the sidecar shares worker credentials with the pod's workers: embedded NATS and workerCredentials.enabled. */}}
{{- define "toolsidecar.workerCredentials" -}}
{{- if and .Values.nats.embedded.workerCredentials.enabled (not .Values.nats.url) -}}true{{- end -}}
{{- end -}}

{{- define "toolsidecar.embeddedStore" -}}
{{- if and .Values.durability.enabled (not .Values.nats.url) -}}true{{- end -}}
{{- end -}}


{{/* The podSelector labels, required by what selects the application's pods. */}}
{{- define "toolsidecar.podSelector" -}}
{{- if not .root.Values.podSelector -}}
{{- fail (printf "%s selects your application's pods: set podSelector to their labels" .what) -}}
{{- end -}}
{{- toYaml .root.Values.podSelector -}}
{{- end -}}
