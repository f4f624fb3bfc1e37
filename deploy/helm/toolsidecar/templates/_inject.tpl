{{/*
The named templates an application's chart calls to add toolsidecar to its
own pods. Declare this chart as a dependency and pass its scope, in your
Deployment (or StatefulSet, Job...) template:

  {{- $ts := .Subcharts.toolsidecar }}
  metadata:
    annotations:
      {{- include "toolsidecar.podAnnotations" $ts | nindent 8 }}
  spec:
    terminationGracePeriodSeconds: {{ include "toolsidecar.terminationGracePeriodSeconds" $ts }}
    initContainers:
      {{- include "toolsidecar.initContainers" $ts | nindent 8 }}
    containers:
      - name: my-app ...
      {{- include "toolsidecar.containers" $ts | nindent 8 }}
    volumes:
      {{- include "toolsidecar.volumes" $ts | nindent 8 }}

A worker container of the application's own (a Go, Node or Python worker
in the pod, on the embedded NATS server) takes the worker credentials the
sidecar issues with two more includes, and runs as the sidecar's user:

      - name: my-worker ...
        env:
          {{- include "toolsidecar.workerEnv" $ts | nindent 10 }}
        volumeMounts:
          {{- include "toolsidecar.workerVolumeMounts" $ts | nindent 10 }}

initContainers and containers each render the sidecar or nothing, after
sidecar.mode: both are included, so that switching modes changes no template.
Point the SDK at http://127.0.0.1:<sidecar.port>.
*/}}

{{/* The sidecar as a native sidecar (sidecar.mode native), or nothing. */}}
{{- define "toolsidecar.initContainers" -}}
{{- if eq .Values.sidecar.mode "native" -}}
{{- if semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version -}}
{{- fail (printf "toolsidecar: sidecar.mode native needs Kubernetes 1.29+ (this cluster: %s); set sidecar.mode: classic" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{ include "toolsidecar.sidecarContainer" . }}
  # A native sidecar (Kubernetes 1.29+): started and ready before the
  # application's containers, stopped after them.
  restartPolicy: Always
{{- end -}}
{{- end -}}

{{/* The sidecar as an ordinary container (sidecar.mode classic), or nothing. */}}
{{- define "toolsidecar.containers" -}}
{{- if eq .Values.sidecar.mode "classic" -}}
{{ include "toolsidecar.sidecarContainer" . }}
{{- end -}}
{{- end -}}

{{/* A checksum of the sidecar's configuration: a change rolls the pods. */}}
{{- define "toolsidecar.podAnnotations" -}}
checksum/toolsidecar-config: {{ include "toolsidecar.config" . | sha256sum }}
{{- end -}}

{{/* Longer than the sidecar's drain, so that batches finish on SIGTERM. */}}
{{- define "toolsidecar.terminationGracePeriodSeconds" -}}
{{ add 15 (trimSuffix "s" .Values.sidecar.shutdownTimeout | int) }}
{{- end -}}

{{/* The pod volumes the sidecar mounts. */}}
{{- define "toolsidecar.volumes" -}}
- name: toolsidecar-config
  configMap:
    name: {{ include "toolsidecar.fullname" . }}-config
{{- include "toolsidecar.secretVolumes" . }}
{{- if (include "toolsidecar.embeddedStore" .) }}
- name: toolsidecar-store
  {{- toYaml .Values.nats.embedded.storeVolume | nindent 2 }}
{{- end }}
{{- if (include "toolsidecar.workerCredentials" .) }}
- name: toolsidecar-workers
  emptyDir: { medium: Memory, sizeLimit: 1Mi }
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The sidecar container, in either mode. */}}
{{- define "toolsidecar.sidecarContainer" -}}
- name: toolsidecar
  image: {{ include "toolsidecar.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["run", "--config", "/etc/toolsidecar/config.yaml", "--log-level", {{ .Values.sidecar.logLevel | quote }}]
  ports:
    # The API listens on 127.0.0.1:{{ .Values.sidecar.port }}, inside the pod only.
    - { name: ops, containerPort: {{ .Values.sidecar.opsPort }}, protocol: TCP }
  {{- /* No GOMEMLIMIT: the binary sets its runtime's limit below the
  container's (its cgroup's), leaving room for the memory the runtime does
  not count. A GOMEMLIMIT equal to the limit would not. */}}
  {{- with .Values.sidecar.extraEnv }}
  env:
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
    {{- if (include "toolsidecar.workerCredentials" .) }}
    - { name: toolsidecar-workers, mountPath: {{ .Values.nats.embedded.workerCredentials.mountPath | quote }} }
    {{- end }}
    {{- with .Values.sidecar.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* A worker container's environment: where the credentials file is (nothing on an external NATS). */}}
{{- define "toolsidecar.workerEnv" -}}
{{- if (include "toolsidecar.workerCredentials" .) -}}
- { name: TOOLSIDECAR_WORKER_CREDENTIALS, value: {{ printf "%s/worker-credentials.json" .Values.nats.embedded.workerCredentials.mountPath | quote }} }
{{- end -}}
{{- end -}}

{{/* A worker container's mounts: the credentials' folder, read-only (nothing on an external NATS). */}}
{{- define "toolsidecar.workerVolumeMounts" -}}
{{- if (include "toolsidecar.workerCredentials" .) -}}
- { name: toolsidecar-workers, mountPath: {{ .Values.nats.embedded.workerCredentials.mountPath | quote }}, readOnly: true }
{{- end -}}
{{- end -}}
