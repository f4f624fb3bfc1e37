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

{{- define "toolsidecar.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The sidecar's config.yaml. Secrets are files, never values. */}}
{{- define "toolsidecar.config" -}}
durability:
  enabled: {{ .Values.durability.enabled }}
  replicas: {{ .Values.durability.replicas }}
  lease_ttl: {{ .Values.durability.leaseTTL }}
core:
  url: {{ .Values.core.url | quote }}
  {{- if .Values.core.apiKeySecret.name }}
  api_key_file: /var/run/secrets/toolsidecar/core/{{ .Values.core.apiKeySecret.key }}
  {{- end }}
  timeout: {{ .Values.core.timeout }}
  stream_idle_timeout: {{ .Values.core.streamIdleTimeout }}
nats:
  url: {{ .Values.nats.url | quote }}
  subject_prefix: {{ .Values.nats.subjectPrefix }}
  {{- if .Values.nats.credsSecret.name }}
  creds_file: /var/run/secrets/toolsidecar/nats/{{ .Values.nats.credsSecret.key }}
  {{- end }}
  embedded:
    listen: {{ .Values.nats.embedded.listen | quote }}
    allow_anonymous: {{ .Values.nats.embedded.allowAnonymous }}
    {{- if (include "toolsidecar.embeddedStore" .) }}
    store_dir: {{ .Values.nats.embedded.storeDir | quote }}
    {{- end }}
    {{- with .Values.nats.embedded.workers }}
    workers:
      {{- toYaml . | nindent 6 }}
    {{- end }}
server:
  listen: {{ printf "%s:%d" (ternary "0.0.0.0" "127.0.0.1" .Values.sidecar.bindAll) (int .Values.sidecar.port) | quote }}
  proxy: {{ .Values.sidecar.proxy }}
  {{- if .Values.sidecar.authTokenSecret.name }}
  auth_token_file: /var/run/secrets/toolsidecar/token/{{ .Values.sidecar.authTokenSecret.key }}
  {{- end }}
  shutdown_timeout: {{ .Values.sidecar.shutdownTimeout }}
executor:
  max_turns: {{ .Values.executor.maxTurns }}
  max_parallel: {{ .Values.executor.maxParallel }}
  missing_tool: {{ .Values.executor.missingTool }}
tracing:
  otlp_endpoint: {{ .Values.tracing.otlpEndpoint | quote }}
  insecure: {{ .Values.tracing.insecure }}
  sample_ratio: {{ .Values.tracing.sampleRatio }}
tools:
{{- toYaml .Values.tools | nindent 2 }}
{{- end -}}

{{/* Secret-backed volumes shared by the sidecar and the workers. */}}
{{- define "toolsidecar.secretVolumes" -}}
{{- if .Values.core.apiKeySecret.name }}
- name: core-api-key
  secret:
    secretName: {{ .Values.core.apiKeySecret.name }}
    items: [{ key: {{ .Values.core.apiKeySecret.key }}, path: {{ .Values.core.apiKeySecret.key }} }]
{{- end }}
{{- if .Values.nats.credsSecret.name }}
- name: nats-creds
  secret:
    secretName: {{ .Values.nats.credsSecret.name }}
    items: [{ key: {{ .Values.nats.credsSecret.key }}, path: {{ .Values.nats.credsSecret.key }} }]
{{- end }}
{{- if .Values.sidecar.authTokenSecret.name }}
- name: auth-token
  secret:
    secretName: {{ .Values.sidecar.authTokenSecret.name }}
    items: [{ key: {{ .Values.sidecar.authTokenSecret.key }}, path: {{ .Values.sidecar.authTokenSecret.key }} }]
{{- end }}
{{- end -}}

{{- define "toolsidecar.secretMounts" -}}
{{- if .Values.core.apiKeySecret.name }}
- { name: core-api-key, mountPath: /var/run/secrets/toolsidecar/core, readOnly: true }
{{- end }}
{{- if .Values.nats.credsSecret.name }}
- { name: nats-creds, mountPath: /var/run/secrets/toolsidecar/nats, readOnly: true }
{{- end }}
{{- if .Values.sidecar.authTokenSecret.name }}
- { name: auth-token, mountPath: /var/run/secrets/toolsidecar/token, readOnly: true }
{{- end }}
{{- end -}}

{{/*
The sidecar container block. This is what joins an application's pod:
add it to the pod's containers, with the volumes of toolsidecar.podVolumes.
*/}}
{{- define "toolsidecar.sidecarContainer" -}}
- name: toolsidecar
  image: {{ include "toolsidecar.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["run", "--config", "/etc/toolsidecar/config.yaml", "--log-level", {{ .Values.sidecar.logLevel | quote }}]
  ports:
    - { name: http, containerPort: {{ .Values.sidecar.port }}, protocol: TCP }
  env:
    # The Go runtime keeps the heap under the container's memory limit.
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef: { resource: limits.memory, divisor: "1" }
    {{- with .Values.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    {{- toYaml .Values.sidecar.startupProbe | nindent 4 }}
  livenessProbe:
    {{- toYaml .Values.sidecar.livenessProbe | nindent 4 }}
  readinessProbe:
    {{- toYaml .Values.sidecar.readinessProbe | nindent 4 }}
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - { name: toolsidecar-config, mountPath: /etc/toolsidecar, readOnly: true }
    {{- include "toolsidecar.secretMounts" . | nindent 4 }}
    {{- if (include "toolsidecar.embeddedStore" .) }}
    - { name: toolsidecar-store, mountPath: {{ .Values.nats.embedded.storeDir | quote }} }
    {{- end }}
    {{- with .Values.sidecar.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{- define "toolsidecar.podVolumes" -}}
- name: toolsidecar-config
  configMap:
    name: {{ include "toolsidecar.fullname" . }}-config
{{ include "toolsidecar.secretVolumes" . }}
{{- if (include "toolsidecar.embeddedStore" .) }}
- name: toolsidecar-store
  {{- toYaml .Values.nats.embedded.storeVolume | nindent 2 }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Non-empty when the embedded server keeps JetStream files: durable mode without an external NATS. */}}
{{- define "toolsidecar.embeddedStore" -}}
{{- if and .Values.durability.enabled (not .Values.nats.url) -}}true{{- end -}}
{{- end -}}
