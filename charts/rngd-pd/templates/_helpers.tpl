{{/* Names and labels. */}}
{{- define "rngd-pd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "rngd-pd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: pd (shm), prefill, decode, gateway, kv-relay. */}}
{{- define "rngd-pd.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* True when the KV transport needs the relay (tcp, nixl-ucx). */}}
{{- define "rngd-pd.needsRelay" -}}
{{- if has .Values.airm.kvTransport (list "tcp" "nixl-ucx") -}}true{{- end -}}
{{- end -}}

{{- define "rngd-pd.image" -}}
{{- if eq .Values.image.mode "hostPath" -}}
{{ .Values.image.baseImage }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The InferencePool's name (created here or joined). */}}
{{- define "rngd-pd.poolName" -}}
{{ .Values.inferencePool.name | default (include "rngd-pd.fullname" .) }}
{{- end -}}

{{/* True with llm-d's topology (the pool selects prefill and decode pods; the gateway is the decode pod's sidecar). */}}
{{- define "rngd-pd.sidecar" -}}
{{- if eq .Values.topology "sidecar" -}}
{{- if not (include "rngd-pd.needsRelay" .) -}}
{{- fail "topology sidecar needs airm.kvTransport tcp or nixl-ucx (prefill and decode in pods of their own)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* True when the worker of `role` publishes KV events (kvEvents.enabled): every decode worker, and prefill workers in pods of their own (tcp, nixl-ucx); a PD pod has one address, so only its decode worker publishes. */}}
{{- define "rngd-pd.kvEvents" -}}
{{- if and .root.Values.kvEvents.enabled (or (eq .role "decode") (include "rngd-pd.needsRelay" .root)) -}}
true
{{- end -}}
{{- end -}}

{{- define "rngd-pd.relayAddr" -}}
{{ include "rngd-pd.fullname" . }}-kv-relay.{{ .Release.Namespace }}.svc:{{ .Values.kvRelay.port }}
{{- end -}}

{{/* Container hardening shared by every container. */}}
{{- define "rngd-pd.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Volume mounts every container gets: scratch /tmp, the engine cache, and the repository (hostPath mode). */}}
{{- define "rngd-pd.baseMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /cache
{{- if eq .Values.image.mode "hostPath" }}
- name: repo
  mountPath: /app
  readOnly: true
{{- end }}
{{- if .Values.tls.enabled }}
- name: airm-tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "rngd-pd.baseVolumes" -}}
- name: tmp
  emptyDir: {}
- name: cache
  emptyDir: {}
{{- if eq .Values.image.mode "hostPath" }}
- name: repo
  hostPath:
    path: {{ required "image.repoHostPath is required with image.mode hostPath" .Values.image.repoHostPath }}
    type: Directory
{{- end }}
{{- if .Values.tls.enabled }}
- name: airm-tls
  secret:
    secretName: {{ include "rngd-pd.tlsSecret" . }}
{{- end }}
{{- end -}}

{{/*
The Secret of tls.enabled: tls.existingSecret, or the one tls.certManager's Certificate writes.
Exactly one of them must be set.
*/}}
{{- define "rngd-pd.tlsSecret" -}}
{{- $t := .Values.tls -}}
{{- if and $t.existingSecret $t.certManager.enabled }}
{{- fail "tls: set tls.existingSecret or tls.certManager.enabled, not both" }}
{{- else if $t.existingSecret }}
{{- $t.existingSecret }}
{{- else if $t.certManager.enabled }}
{{- include "rngd-pd.fullname" . }}-tls
{{- else }}
{{- fail "tls.enabled needs tls.existingSecret (a Secret with tls.crt, tls.key and ca.crt) or tls.certManager.enabled" }}
{{- end }}
{{- end -}}

{{/* http, or https with tls.enabled: how gateways reach workers. */}}
{{- define "rngd-pd.workerScheme" -}}
{{- ternary "https" "http" (.Values.tls.enabled | default false) -}}
{{- end -}}

{{/* AIRM_TLS_DIR and AIRM_TLS_RELOAD_S of every part with tls.enabled. */}}
{{- define "rngd-pd.tlsEnv" -}}
{{- if .Values.tls.enabled }}
- name: AIRM_TLS_DIR
  value: {{ .Values.tls.mountPath | quote }}
- name: AIRM_TLS_RELOAD_S
  value: {{ .Values.tls.reloadSeconds | quote }}
{{- end }}
{{- end -}}

{{/* Volumes of pods that run workers: the device-plugin checkpoint and the model. */}}
{{- define "rngd-pd.workerVolumes" -}}
- name: device-plugins
  hostPath:
    path: {{ dir .Values.devicePlugin.checkpointPath }}
    type: DirectoryOrCreate
{{- if .Values.model.hostPath }}
- name: model
  hostPath:
    path: {{ .Values.model.hostPath }}
    type: Directory
{{- end }}
{{- end -}}

{{/*
One worker container. Args: dict "root" $ "role" "prefill"|"decode" "spec" .Values.<role>
["localPrefill" true: a decode worker that also prefills (topology sidecar)].
The worker finds its card with --chip -1 (the kubelet checkpoint and POD_UID).
*/}}
{{/*
The grace period of a pod whose containers drain: the preStop pause, the drain, and 10 s to exit.
*/}}
{{- define "rngd-pd.gracePeriod" -}}
{{- int (add (ceil .Values.airm.preStopSeconds) (ceil .Values.airm.drainSeconds) 10) -}}
{{- end -}}

{{/*
A serving container's preStop hook: it keeps serving for airm.preStopSeconds after its pod is
deleted, while endpoint pickers, Services and proxies stop sending it requests, and only then gets
SIGTERM and drains (the kubelet's sleep action, Kubernetes 1.30+; 0: none).
*/}}
{{- define "rngd-pd.preStop" -}}
{{- if gt (int .Values.airm.preStopSeconds) 0 }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ int .Values.airm.preStopSeconds }}
{{- end }}
{{- end -}}

{{- define "rngd-pd.worker" -}}
{{- $v := .root.Values -}}
- name: {{ .role }}
  image: {{ include "rngd-pd.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["node", "/app/packages/worker/bin/airm-worker.mjs"]
  args:
    - --role
    - {{ .role }}
    - --backend
    - {{ .spec.backend | quote }}
    - --chip
    - "-1"
    - --host
    - 0.0.0.0
    - --port
    - {{ .spec.port | quote }}
    {{- if $v.tls.enabled }}
    - --metrics-port
    - {{ .spec.metricsPort | quote }}
    {{- end }}
    {{- if not (kindIs "invalid" $v.maxModelLen) }}
    - --max-model-len
    - {{ $v.maxModelLen | quote }}
    {{- end }}
    {{- if and (eq .role "decode") (not (kindIs "invalid" .spec.batch)) }}
    - --B
    - {{ .spec.batch | quote }}
    {{- end }}
    {{- if .localPrefill }}
    - --local-prefill
    {{- end }}
    {{- range .spec.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: MODEL
      value: {{ $v.model.path | quote }}
    - name: AIRM_KV_TRANSPORT
      value: {{ $v.airm.kvTransport | quote }}
    - name: AIRM_KUBELET_CHECKPOINT
      value: {{ $v.devicePlugin.checkpointPath | quote }}
    - name: POD_UID
      valueFrom:
        fieldRef:
          fieldPath: metadata.uid
    - name: AIRM_ARTIFACT_CACHE
      value: /cache/artifacts
    - name: AIRM_DRAIN_S
      value: {{ $v.airm.drainSeconds | quote }}
    - name: AIRM_BLOCK_SIZE
      value: {{ $v.kvCache.blockSize | quote }}
    - name: AIRM_KV_CACHE_MEMORY
      value: {{ $v.kvCache.memory | quote }}
    - name: AIRM_MAX_NUM_BATCHED_TOKENS
      value: {{ $v.kvCache.maxNumBatchedTokens | quote }}
    - name: AIRM_MAX_NUM_SEQS
      value: {{ $v.kvCache.maxNumSeqs | quote }}
    {{- if eq $v.airm.kvTransport "shm" }}
    - name: PD_SHM_ROOT
      value: /dev/shm/rngd_kv_cluster
    {{- end }}
    {{- if eq $v.airm.kvTransport "nixl" }}
    - name: AIRM_KV_NIXL_ADDR
      value: {{ printf "127.0.0.1:%v" $v.nixl.port | quote }}
    - name: AIRM_KV_NIXL_POOL_MB
      value: {{ $v.nixl.poolMb | quote }}
    {{- end }}
    {{- if include "rngd-pd.kvEvents" (dict "root" .root "role" .role) }}
    - name: AIRM_KV_EVENTS_CONFIG
      value: {{ dict "enable_kv_cache_events" true "publisher" "zmq" "endpoint" (printf "tcp://*:%v" $v.kvEvents.port) "replay_endpoint" (printf "tcp://*:%v" $v.kvEvents.replayPort) | toJson | quote }}
    {{- end }}
    {{- with $v.lora }}
    {{- if or .enabled .modules }}
    - name: AIRM_ENABLE_LORA
      value: "1"
    {{- with .modules }}
    - name: AIRM_LORA_MODULES
      value: {{ $mods := list }}{{ range . }}{{ $mods = append $mods (printf "%s=%s" .name .path) }}{{ end }}{{ join "," $mods | quote }}
    {{- end }}
    - name: AIRM_MAX_LORAS
      value: {{ .maxLoras | quote }}
    - name: AIRM_MAX_LORA_RANK
      value: {{ .maxLoraRank | quote }}
    {{- end }}
    {{- end }}
    {{- if include "rngd-pd.needsRelay" .root }}
    - name: AIRM_KV_TCP_ADDR
      value: {{ include "rngd-pd.relayAddr" .root | quote }}
    {{- end }}
    {{- with include "rngd-pd.credentialsEnv" (dict "root" .root "gateway" false) | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "rngd-pd.tracingEnv" (dict "root" .root "service" "airm-worker" "container" .role) | trim }}
    {{- . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ .role }}
      containerPort: {{ .spec.port }}
    {{- if $v.tls.enabled }}
    - name: {{ .role }}-metrics
      containerPort: {{ .spec.metricsPort }}
    {{- end }}
    {{- if include "rngd-pd.kvEvents" (dict "root" .root "role" .role) }}
    - name: kv-events
      containerPort: {{ $v.kvEvents.port }}
    - name: kv-replay
      containerPort: {{ $v.kvEvents.replayPort }}
    {{- end }}
  {{- include "rngd-pd.preStop" .root | nindent 2 }}
  {{- /* With TLS the serving port asks for a client certificate, which the kubelet has not: probe the plain metrics port. */}}
  {{- $probePort := ternary .spec.metricsPort .spec.port ($v.tls.enabled | default false) }}
  readinessProbe:
    httpGet: { path: /health, port: {{ $probePort }} }
    periodSeconds: 5
  livenessProbe:
    httpGet: { path: /health, port: {{ $probePort }} }
    initialDelaySeconds: 30
    periodSeconds: 10
    timeoutSeconds: 5
    failureThreshold: 6
  resources: {{- toYaml .spec.resources | nindent 4 }}
  securityContext:
    {{- include "rngd-pd.containerSecurity" .root | nindent 4 }}
    runAsNonRoot: {{ $v.workerSecurity.runAsNonRoot }}
  volumeMounts:
    {{- include "rngd-pd.baseMounts" .root | nindent 4 }}
    - name: device-plugins
      mountPath: {{ dir $v.devicePlugin.checkpointPath }}
      readOnly: true
    {{- if $v.model.hostPath }}
    - name: model
      mountPath: {{ dir $v.model.path }}
      readOnly: true
    {{- end }}
    {{- if eq $v.airm.kvTransport "shm" }}
    - name: kv-shm
      mountPath: /dev/shm/rngd_kv_cluster
    {{- end }}
    {{- if eq $v.airm.kvTransport "nixl" }}
    - name: kv-shm
      mountPath: /dev/shm
    {{- end }}
{{- end -}}

{{/*
The NIXL agent sidecar of a PD pod (airm.kvTransport nixl): the one agent both workers copy
through, listening on localhost, with the pod's /dev/shm (their arenas) mounted.
*/}}
{{- define "rngd-pd.nixlAgent" -}}
{{- $v := .Values -}}
- name: nixl-agent
  image: {{ include "rngd-pd.image" . }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["node", "/app/packages/kv-nixl/bin/airm-kv-nixl-agent.mjs"]
  args: ["--listen", {{ printf "127.0.0.1:%v" $v.nixl.port | quote }}]
  env:
    - name: AIRM_NIXL_PYTHON
      value: {{ $v.nixl.python | quote }}
    {{- with include "rngd-pd.credentialsEnv" (dict "root" . "gateway" false) | trim }}
    {{- . | nindent 4 }}
    {{- end }}
  readinessProbe:
    tcpSocket: { port: {{ $v.nixl.port }} }
    periodSeconds: 5
  livenessProbe:
    tcpSocket: { port: {{ $v.nixl.port }} }
    initialDelaySeconds: 10
    periodSeconds: 10
  resources: {{- toYaml $v.nixl.resources | nindent 4 }}
  securityContext:
    {{- include "rngd-pd.containerSecurity" . | nindent 4 }}
    runAsNonRoot: true
    runAsUser: {{ $v.podSecurity.runAsUser }}
    runAsGroup: {{ $v.podSecurity.runAsGroup }}
  volumeMounts:
    {{- include "rngd-pd.baseMounts" . | nindent 4 }}
    - name: kv-shm
      mountPath: /dev/shm
{{- end -}}

{{/*
The gateway container in front of the given prefill and decode URLs. Args: dict "root" $
"prefill" URL "decode" URL; or "pool" NAME instead of "prefill": the prefill workers are the
InferencePool's prefill pods (topology sidecar), and a request the picker names no prefill pod
for is prefilled by the decode worker (--local-prefill), as llm-d's sidecar does (--disaggregation header: the picker decides).
*/}}
{{- define "rngd-pd.gateway" -}}
{{- $v := .root.Values -}}
- name: gateway
  image: {{ include "rngd-pd.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["node", "/app/packages/gateway/bin/airm-gateway.mjs"]
  {{- if .pool }}
  args: ["--host", "0.0.0.0", "--port", {{ $v.gateway.port | quote }}, "--prefill-pool", {{ .pool | quote }}, "--decode", {{ .decode | quote }}, "--local-prefill", "--disaggregation", "header"]
  {{- else }}
  args: ["--host", "0.0.0.0", "--port", {{ $v.gateway.port | quote }}, "--prefill", {{ .prefill | quote }}, "--decode", {{ .decode | quote }}]
  {{- end }}
  env:
    - name: AIRM_METRICS_PORT
      value: {{ $v.airm.metricsPort | quote }}
    - name: AIRM_MIGRATION_LIMIT
      value: {{ $v.airm.migrationLimit | quote }}
    - name: AIRM_DRAIN_S
      value: {{ $v.airm.drainSeconds | quote }}
    {{- if .pool }}
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- end }}
    {{- with include "rngd-pd.credentialsEnv" (dict "root" .root "gateway" true) | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "rngd-pd.tracingEnv" (dict "root" .root "service" "airm-gateway" "container" "gateway" "hasNamespace" .pool) | trim }}
    {{- . | nindent 4 }}
    {{- end }}
  ports:
    - name: http
      containerPort: {{ $v.gateway.port }}
    - name: metrics
      containerPort: {{ $v.airm.metricsPort }}
  {{- include "rngd-pd.preStop" .root | nindent 2 }}
  readinessProbe:
    httpGet: { path: /health, port: {{ $v.gateway.port }} }
    periodSeconds: 5
  livenessProbe:
    tcpSocket: { port: {{ $v.gateway.port }} }
    periodSeconds: 10
  resources: {{- toYaml $v.gateway.resources | nindent 4 }}
  securityContext:
    {{- include "rngd-pd.containerSecurity" .root | nindent 4 }}
    runAsNonRoot: true
    runAsUser: {{ $v.podSecurity.runAsUser }}
    runAsGroup: {{ $v.podSecurity.runAsGroup }}
  volumeMounts:
    {{- include "rngd-pd.baseMounts" .root | nindent 4 }}
{{- end -}}

{{/*
The credentials env entries of a part, from the Secrets named in .Values.security: the internal
token for every part, and with "gateway" true the API keys too. Args: dict "root" $ "gateway" bool.
*/}}
{{- define "rngd-pd.credentialsEnv" -}}
{{- $s := .root.Values.security -}}
{{- include "rngd-pd.tlsEnv" .root }}
{{- if $s.internalTokenSecret }}
- name: AIRM_INTERNAL_TOKEN
  valueFrom:
    secretKeyRef: { name: {{ $s.internalTokenSecret | quote }}, key: token }
{{- end }}
{{- if and .gateway $s.apiKeySecret }}
- name: AIRM_API_KEY
  valueFrom:
    secretKeyRef: { name: {{ $s.apiKeySecret | quote }}, key: keys }
{{- end }}
{{- end -}}

{{/*
The OpenTelemetry env entries of a part that exports spans (the gateway and the workers), with
tracing.enabled. POD_NAME and POD_NAMESPACE come from the downward API before
OTEL_RESOURCE_ATTRIBUTES, which names them as $(POD_NAME) and $(POD_NAMESPACE): the kubelet
expands earlier entries. The user's resourceAttributes follow, their values percent-encoded.
Args: dict "root" $ "service" airm-gateway|airm-worker "container" NAME ["hasNamespace" true: the
container sets POD_NAMESPACE already].
*/}}
{{- define "rngd-pd.tracingEnv" -}}
{{- $t := .root.Values.tracing -}}
{{- if $t.enabled }}
{{- $ratio := list "traceidratio" "parentbased_traceidratio" }}
{{- if and (not (kindIs "invalid" $t.samplerArg)) (not (has $t.sampler $ratio)) }}
{{- fail (printf "tracing.samplerArg is read by the traceidratio and parentbased_traceidratio samplers only, not %s" $t.sampler) }}
{{- end }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if not .hasNamespace }}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ required "tracing.otlpEndpoint is required with tracing.enabled" $t.otlpEndpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $t.protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $t.sampler | quote }}
{{- if not (kindIs "invalid" $t.samplerArg) }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $t.samplerArg | toString | quote }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
{{- $attrs := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" (printf "k8s.container.name=%s" .container) }}
{{- range $k, $v := $t.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $k ($v | toString | urlquery | replace "+" "%20")) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- end }}
{{- end -}}
