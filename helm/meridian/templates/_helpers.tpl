{{/*
Names, labels and the pieces every Meridian pod template shares.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "meridian.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The resource-name prefix: <release>-<chart>, or the release name when it already contains
the chart name, or fullnameOverride. Validated to at most 40 characters (meridian.validate),
so "<prefix>-gateway-headless" and StatefulSet pod names stay valid DNS labels.
*/}}
{{- define "meridian.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "meridian.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Component resource names. */}}
{{- define "meridian.gateway.fullname" -}}
{{- printf "%s-gateway" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.gateway.headless" -}}
{{- printf "%s-gateway-headless" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.gateway.quic" -}}
{{- printf "%s-gateway-quic" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.shard.fullname" -}}
{{- printf "%s-shard" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.etcd.fullname" -}}
{{- printf "%s-etcd" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.etcd.headless" -}}
{{- printf "%s-etcd-headless" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.postgres.fullname" -}}
{{- printf "%s-postgres" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.postgres.headless" -}}
{{- printf "%s-postgres-headless" (include "meridian.fullname" .) }}
{{- end }}
{{- define "meridian.config.name" -}}
{{- printf "%s-config" (include "meridian.fullname" .) }}
{{- end }}

{{/*
Selector labels: (dict "ctx" $ "component" "gateway"). Never change these after a release
exists: workload selectors are immutable.
*/}}
{{- define "meridian.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meridian.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* Standard labels: (dict "ctx" $ "component" "gateway"). */}}
{{- define "meridian.labels" -}}
helm.sh/chart: {{ include "meridian.chart" .ctx }}
{{ include "meridian.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: meridian
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{/* The ServiceAccount the Meridian pods run as. */}}
{{- define "meridian.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "meridian.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Meridian image reference: repository@digest, or repository:tag (default appVersion). */}}
{{- define "meridian.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* FQDN suffix of the release's namespace: <namespace>.svc.<clusterDomain>. */}}
{{- define "meridian.svcDomain" -}}
{{- printf "%s.svc.%s" .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* etcd client endpoints, comma-separated: every bundled member, or the external list. */}}
{{- define "meridian.etcdEndpoints" -}}
{{- if .Values.etcd.bundled.enabled }}
{{- $endpoints := list }}
{{- range $i := until (int .Values.etcd.bundled.replicas) }}
{{- $scheme := ternary "https" "http" $.Values.etcd.bundled.security.enabled }}
{{- $endpoints = append $endpoints (printf "%s://%s-%d.%s.%s:%d" $scheme (include "meridian.etcd.fullname" $) $i (include "meridian.etcd.headless" $) (include "meridian.svcDomain" $) (int $.Values.etcd.bundled.clientPort)) }}
{{- end }}
{{- join "," $endpoints }}
{{- else }}
{{- join "," .Values.etcd.external.endpoints }}
{{- end }}
{{- end }}

{{/*
Configuration, as MERIDIAN_* environment variables, split by who reads it. The ConfigMap
holds all three parts; each pod template's checksum covers only the parts its node reads,
so a gateway-only change does not drain every shard. Integers go through int64: Helm reads
numbers as float64 and would print 1048576 as 1.048576e+06.
*/}}
{{- define "meridian.config.common" -}}
MERIDIAN_CLUSTER: {{ .Values.cluster.name | quote }}
MERIDIAN_ETCD: {{ include "meridian.etcdEndpoints" . | quote }}
{{- with include "meridian.etcdClient.secret" . }}
MERIDIAN_ETCD_CA: "/etc/meridian/etcd-client/ca.pem"
{{- if or $.Values.etcd.bundled.enabled (include "meridian.etcdClient.hasCert" $) }}
MERIDIAN_ETCD_CERT: "/etc/meridian/etcd-client/client.pem"
MERIDIAN_ETCD_KEY: "/etc/meridian/etcd-client/client-key.pem"
{{- end }}
{{- end }}
{{- with include "meridian.etcdUser" . }}
MERIDIAN_ETCD_USER: {{ . | quote }}
{{- end }}
MERIDIAN_LEASE_TTL: {{ .Values.cluster.leaseTtlSeconds | int64 | quote }}
MERIDIAN_MOVE_RATE: {{ .Values.world.moveRate | int64 | quote }}
MERIDIAN_LOG_JSON: {{ .Values.cluster.logJson | toString | quote }}
{{- if .Values.cluster.dev }}
MERIDIAN_DEV: "true"
{{- end }}
{{- end }}

{{- define "meridian.config.shard" -}}
MERIDIAN_MAP_WIDTH: {{ .Values.world.width | int64 | quote }}
MERIDIAN_MAP_HEIGHT: {{ .Values.world.height | int64 | quote }}
MERIDIAN_VIEW_RANGE: {{ .Values.world.viewRange | int64 | quote }}
MERIDIAN_SEED: {{ .Values.world.seed | int64 | quote }}
MERIDIAN_RESUME_WINDOW: {{ .Values.shard.resumeWindowSeconds | int64 | quote }}
MERIDIAN_DRAIN_TIMEOUT: {{ .Values.shard.drainTimeoutSeconds | int64 | quote }}
{{- if include "meridian.store.enabled" . }}
MERIDIAN_SAVE_INTERVAL: {{ .Values.shard.saveIntervalSeconds | int64 | quote }}
{{- end }}
{{- end }}

{{- define "meridian.config.gateway" -}}
MERIDIAN_IO: {{ .Values.gateway.io | quote }}
MERIDIAN_PLACEMENT: {{ .Values.gateway.placement | quote }}
MERIDIAN_MAX_FRAME: {{ .Values.gateway.maxFrameBytes | int64 | quote }}
MERIDIAN_MAX_OUTPUT: {{ .Values.gateway.maxOutputBytes | int64 | quote }}
{{- with .Values.gateway.limits }}
MERIDIAN_CHAT_RATE: {{ .chatRate | int64 | quote }}
MERIDIAN_CHAT_BURST: {{ .chatBurst | int64 | quote }}
MERIDIAN_INPUT_FRAME_RATE: {{ .inputFrameRate | int64 | quote }}
MERIDIAN_INPUT_BYTE_RATE: {{ .inputByteRate | int64 | quote }}
MERIDIAN_LOGIN_TIMEOUT: {{ .loginTimeout | quote }}
MERIDIAN_IDLE_TIMEOUT: {{ .idleTimeout | quote }}
MERIDIAN_MAX_CONNECTIONS: {{ .maxConnections | int64 | quote }}
MERIDIAN_MAX_CONNECTIONS_PER_ADDRESS: {{ .maxConnectionsPerAddress | int64 | quote }}
MERIDIAN_CONNECT_RATE: {{ .connectRate | int64 | quote }}
MERIDIAN_MAX_OUTPUT_TOTAL: {{ .maxOutputTotalBytes | int64 | quote }}
{{- if .exempt }}
MERIDIAN_LIMIT_EXEMPT: {{ join "," .exempt | quote }}
{{- end }}
{{- end }}
{{- if .Values.gateway.quic.enabled }}
MERIDIAN_QUIC_IDLE_TIMEOUT: {{ printf "%dms" (.Values.gateway.quic.idleTimeoutMs | int64) | quote }}
MERIDIAN_QUIC_KEEP_ALIVE: {{ printf "%dms" (.Values.gateway.quic.keepAliveMs | int64) | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.gateway.workers) }}
MERIDIAN_WORKERS: {{ .Values.gateway.workers | int64 | quote }}
{{- end }}
{{- if include "meridian.loginKeys.enabled" . }}
MERIDIAN_JWKS: {{ include "meridian.loginKeys.path" . | quote }}
{{- end }}
{{- end }}

{{/* Name and key of the resume key's Secret; the name is empty in dev mode without a key. */}}
{{- define "meridian.resumeKey.secretName" -}}
{{- if .Values.resumeKey.existingSecret }}
{{- .Values.resumeKey.existingSecret }}
{{- else if .Values.resumeKey.value }}
{{- printf "%s-resume-key" (include "meridian.fullname" .) }}
{{- end }}
{{- end }}
{{- define "meridian.adminToken.secretName" -}}
{{- if .Values.adminToken.existingSecret }}
{{- .Values.adminToken.existingSecret }}
{{- else if .Values.adminToken.value }}
{{- printf "%s-admin-token" (include "meridian.fullname" .) }}
{{- end }}
{{- end }}
{{- define "meridian.resumeKey.secretKey" -}}
{{- if .Values.resumeKey.existingSecret }}
{{- .Values.resumeKey.existingSecretKey }}
{{- else }}
{{- print "resume-key" }}
{{- end }}
{{- end }}

{{/*
The player store. "meridian.store.enabled" is "true" (a non-empty string) when the nodes
have one: the bundled PostgreSQL or an external one.
*/}}
{{- define "meridian.store.enabled" -}}
{{- if or .Values.store.bundled.enabled .Values.store.external.url .Values.store.external.existingSecret -}}
true
{{- end }}
{{- end }}

{{/* Name and key of the Secret holding the bundled PostgreSQL's password. */}}
{{- define "meridian.postgres.secretName" -}}
{{- default (include "meridian.postgres.fullname" .) .Values.store.bundled.existingSecret }}
{{- end }}
{{- define "meridian.postgres.secretKey" -}}
{{- if .Values.store.bundled.existingSecret }}
{{- .Values.store.bundled.existingSecretKey }}
{{- else }}
{{- print "password" }}
{{- end }}
{{- end }}

{{/* Name and key of the Secret holding an external store's URL. */}}
{{- define "meridian.store.secretName" -}}
{{- if .Values.store.external.existingSecret }}
{{- .Values.store.external.existingSecret }}
{{- else }}
{{- printf "%s-store" (include "meridian.fullname" .) }}
{{- end }}
{{- end }}
{{- define "meridian.store.secretKey" -}}
{{- if .Values.store.external.existingSecret }}
{{- .Values.store.external.existingSecretKey }}
{{- else }}
{{- print "url" }}
{{- end }}
{{- end }}

{{/*
MERIDIAN_STORE for gateways and shards. External: the whole URL from its Secret. Bundled:
the URL is put together in the pod from the password's Secret ($(STORE_PASSWORD), which
Kubernetes expands), so the password is in no rendered object but its Secret, and a
password from an existing Secret works the same way.
*/}}
{{- define "meridian.env.store" -}}
{{- if .Values.store.bundled.enabled -}}
- name: STORE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "meridian.postgres.secretName" . }}
      key: {{ include "meridian.postgres.secretKey" . }}
- name: MERIDIAN_STORE
  value: {{ printf "postgres://%s:$(STORE_PASSWORD)@%s.%s:%d/%s" .Values.store.bundled.username (include "meridian.postgres.fullname" .) (include "meridian.svcDomain" .) (int .Values.store.bundled.port) .Values.store.bundled.database | quote }}
{{- else if include "meridian.store.enabled" . -}}
- name: MERIDIAN_STORE
  valueFrom:
    secretKeyRef:
      name: {{ include "meridian.store.secretName" . }}
      key: {{ include "meridian.store.secretKey" . }}
{{- end }}
{{- end }}

{{/* Gateway login keys: "true" when a JWKS Secret or ConfigMap is given; its mount path. */}}
{{- define "meridian.loginKeys.enabled" -}}
{{- if or .Values.gateway.loginKeys.existingSecret .Values.gateway.loginKeys.existingConfigMap -}}
true
{{- end }}
{{- end }}
{{- define "meridian.loginKeys.path" -}}
/etc/meridian/login-keys/jwks.json
{{- end }}

{{/*
Pod-template annotations of a Meridian node: (dict "ctx" $ "config" <rendered config parts>
"extra" <podAnnotations>). The checksums roll the pods when their configuration, the
chart-managed resume key or the chart-managed store URL changes. The bundled PostgreSQL's
password is not among them: PostgreSQL takes it at first start only, so a changed one would
only lock the nodes out.
*/}}
{{- define "meridian.podAnnotations" -}}
checksum/config: {{ .config | sha256sum }}
{{- if or (and .ctx.Values.resumeKey.value (not .ctx.Values.resumeKey.existingSecret)) (and .ctx.Values.adminToken.value (not .ctx.Values.adminToken.existingSecret)) }}
checksum/resume-key: {{ include (print .ctx.Template.BasePath "/secret.yaml") .ctx | sha256sum }}
{{- end }}
{{- if and .ctx.Values.store.external.url (not .ctx.Values.store.external.existingSecret) }}
checksum/store: {{ include (print .ctx.Template.BasePath "/store-secret.yaml") .ctx | sha256sum }}
{{- end }}
{{- if .ctx.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .ctx.Values.cluster.adminPort | int | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Environment of a Meridian node container: downward-API identity first (later values refer
to it as $(POD_NAME)), then the resume key. The rest comes from the ConfigMap (envFrom).
*/}}
{{- define "meridian.env.identity" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}

{{- define "meridian.env.resumeKey" -}}
{{- $secret := include "meridian.resumeKey.secretName" . }}
{{- if $secret -}}
- name: MERIDIAN_RESUME_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "meridian.resumeKey.secretKey" . }}
{{- if or .Values.resumeKey.previous .Values.resumeKey.existingSecret }}
- name: MERIDIAN_RESUME_KEY_PREVIOUS
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: resume-key-previous
      optional: true
{{- end }}
{{- end }}
{{- $admin := include "meridian.adminToken.secretName" . }}
{{- if $admin }}
- name: MERIDIAN_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $admin }}
      key: {{ if .Values.adminToken.existingSecret }}{{ .Values.adminToken.existingSecretKey }}{{ else }}admin-token{{ end }}
{{- end }}
{{- end }}

{{/*
The node id from the StatefulSet ordinal, as a shell expression: pod "<name>-3" is id 4
(ids start at 1). Kubernetes leaves "$((...))" alone: it only expands $(NAME) references to
defined variables, and "( ${POD_NAME##*-} + 1 " is none.
*/}}
{{- define "meridian.idFromOrdinal" -}}
$(( ${POD_NAME##*-} + 1 ))
{{- end }}

{{/*
A map with overrides laid over it, as YAML: (dict "defaults" <map> "overrides" <map>). Each
key of the overrides replaces the default's, except that null removes the key (platforms
that pick the user themselves, such as OpenShift's restricted SCC, need runAsUser,
runAsGroup and fsGroup unset) and a map (seccompProfile, capabilities, seLinuxOptions) is
laid over the default's map the same way, key by key. Used for every security context, so
that an empty override renders the chart's defaults.
*/}}
{{- define "meridian.overlay" -}}
{{- $result := deepCopy .defaults }}
{{- range $key, $value := .overrides }}
{{- if kindIs "invalid" $value }}
{{- $_ := unset $result $key }}
{{- else if kindIs "map" $value }}
{{- $base := get $result $key }}
{{- if not (kindIs "map" $base) }}
{{- $base = dict }}
{{- end }}
{{- $_ := set $result $key (include "meridian.overlay" (dict "defaults" $base "overrides" $value) | fromYaml) }}
{{- else }}
{{- $_ := set $result $key $value }}
{{- end }}
{{- end }}
{{- toYaml $result }}
{{- end }}

{{/* The chart's container security context, for every container it runs. */}}
{{- define "meridian.containerSecurityContext.defaults" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
    - ALL
{{- end }}

{{/* A container's security context: the defaults with a component's overrides (a map). */}}
{{- define "meridian.containerSecurityContext" -}}
{{- include "meridian.overlay" (dict "defaults" (include "meridian.containerSecurityContext.defaults" . | fromYaml) "overrides" .) }}
{{- end }}

{{/* The pod security context of the pods that run the Meridian image (its user, 10001). */}}
{{- define "meridian.podSecurityContext.defaults" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Their pod security context: the defaults with a component's overrides (a map). */}}
{{- define "meridian.podSecurityContext" -}}
{{- include "meridian.overlay" (dict "defaults" (include "meridian.podSecurityContext.defaults" . | fromYaml) "overrides" .) }}
{{- end }}

{{/*
The end of a container's env: RUST_LOG (the component's logLevel, a tracing filter such as
`info` or `info,meridian_shard=debug`), then the user's extraEnv, last so that a name given
there wins over the chart's (Kubernetes keeps the last of equal names, and env wins over
envFrom, so it can also override one MERIDIAN_* variable of the ConfigMap for one
component): (dict "logLevel" <string or ""> "extraEnv" <list>).
*/}}
{{- define "meridian.env.extra" -}}
{{- if .logLevel }}
- name: RUST_LOG
  value: {{ .logLevel | quote }}
{{- end }}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Startup, readiness and liveness probes on the named admin port: (probes values). */}}
{{- define "meridian.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: {{ .startup.periodSeconds }}
  timeoutSeconds: {{ .startup.timeoutSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: {{ .readiness.periodSeconds }}
  timeoutSeconds: {{ .readiness.timeoutSeconds }}
  failureThreshold: {{ .readiness.failureThreshold }}
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: {{ .liveness.periodSeconds }}
  timeoutSeconds: {{ .liveness.timeoutSeconds }}
  failureThreshold: {{ .liveness.failureThreshold }}
{{- end }}

{{/* topologySpreadConstraints with the component's selector: (dict "ctx" $ "component" c "constraints" list). */}}
{{- define "meridian.topologySpread" -}}
{{- $selector := include "meridian.selectorLabels" (dict "ctx" .ctx "component" .component) | fromYaml }}
{{- $constraints := list }}
{{- range .constraints }}
{{- $constraints = append $constraints (merge (dict "labelSelector" (dict "matchLabels" $selector)) .) }}
{{- end }}
{{- toYaml $constraints }}
{{- end }}

{{/*
Init containers of gateways and shards. wait-for-etcd: `meridian status` connects with the
same client the node uses, so success means the node will get past its own etcd connect.
wait-for-store (bundled PostgreSQL only): a TCP connect to its Service, which has an
endpoint only once pg_isready answers (during initdb PostgreSQL listens on no TCP port), so
the node's own store connect at start, which it does not retry, finds PostgreSQL up.
(dict "ctx" $ "securityContext" <the component's containerSecurityContext overrides>).
*/}}
{{- define "meridian.initContainers" -}}
{{- $securityContext := .securityContext }}
{{- with .ctx }}
{{- $waitForStore := and .Values.waitForStore .Values.store.bundled.enabled }}
{{- if or .Values.waitForEtcd $waitForStore -}}
initContainers:
{{- if .Values.waitForEtcd }}
  - name: wait-for-etcd
    image: {{ include "meridian.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command:
      - /bin/sh
      - -c
      - |
        until meridian status >/dev/null 2>&1; do
          echo "waiting for etcd at $MERIDIAN_ETCD"
          sleep 2
        done
    envFrom:
      - configMapRef:
          name: {{ include "meridian.config.name" . }}
    {{- with include "meridian.env.etcdPassword" . }}
    env:
      {{- . | nindent 6 }}
    {{- end }}
    {{- with include "meridian.etcdClient.mount" . }}
    volumeMounts:
      {{- . | nindent 6 }}
    {{- end }}
    securityContext:
      {{- include "meridian.containerSecurityContext" $securityContext | nindent 6 }}
    resources:
      {{- include "meridian.initResources" . | nindent 6 }}
{{- end }}
{{- if $waitForStore }}
{{- $address := printf "%s.%s/%d" (include "meridian.postgres.fullname" .) (include "meridian.svcDomain" .) (int .Values.store.bundled.port) }}
  - name: wait-for-store
    image: {{ include "meridian.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    # bash's /dev/tcp: the image has no PostgreSQL client.
    command:
      - /bin/bash
      - -c
      - |
        until timeout 2 bash -c 'exec 3<>/dev/tcp/{{ $address }}' 2>/dev/null; do
          echo "waiting for the player store (PostgreSQL) at {{ replace "/" ":" $address }}"
          sleep 2
        done
    securityContext:
      {{- include "meridian.containerSecurityContext" $securityContext | nindent 6 }}
    resources:
      {{- include "meridian.initResources" . | nindent 6 }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "meridian.initResources" -}}
requests:
  cpu: 10m
  memory: 16Mi
limits:
  memory: 64Mi
{{- end }}

{{/*
Fails rendering, with one message per problem, on values the schema cannot express.
Included by the ConfigMap template, which every configuration renders.
*/}}
{{- define "meridian.validate" -}}
{{- $problems := list }}
{{- $fullname := include "meridian.fullname" . }}
{{- if gt (len $fullname) 40 }}
{{- $problems = append $problems (printf "the resource-name prefix %q is %d characters, at most 40 fit: set fullnameOverride or use a shorter release name" $fullname (len $fullname)) }}
{{- end }}
{{- $bundled := .Values.etcd.bundled.enabled }}
{{- $external := gt (len .Values.etcd.external.endpoints) 0 }}
{{- if and $bundled $external }}
{{- $problems = append $problems "etcd: set exactly one of etcd.bundled.enabled=true or etcd.external.endpoints, not both" }}
{{- else if not (or $bundled $external) }}
{{- $problems = append $problems "etcd: set exactly one of etcd.bundled.enabled=true or etcd.external.endpoints (a list of http(s)://host:port); neither is set" }}
{{- end }}
{{- with .Values.store }}
{{- $external := or .external.url .external.existingSecret }}
{{- if and .bundled.enabled $external }}
{{- $problems = append $problems "store: set at most one of store.bundled.enabled=true or store.external (url or existingSecret), not both" }}
{{- end }}
{{- if and .external.url .external.existingSecret }}
{{- $problems = append $problems "store.external: set either url or existingSecret, not both" }}
{{- end }}
{{- if and .external.url (not (regexMatch "^postgres(ql)?://[^\\s]+$" .external.url)) }}
{{- $problems = append $problems "store.external.url must be a PostgreSQL URL, postgres://user:password@host:5432/database (sqlite: is for one machine, not for the chart)" }}
{{- end }}
{{- if regexMatch "[?&]sslmode=(require|verify-ca|verify-full)" .external.url }}
{{- $problems = append $problems "store.external.url asks for TLS (sslmode=require or verify-*), but Meridian connects to PostgreSQL without TLS: the server must accept unencrypted connections from the pods" }}
{{- end }}
{{- if and .bundled.password .bundled.existingSecret }}
{{- $problems = append $problems "store.bundled: set either password or existingSecret, not both" }}
{{- end }}
{{- if and .bundled.password (not (regexMatch "^[A-Za-z0-9._~-]+$" .bundled.password)) }}
{{- $problems = append $problems "store.bundled.password: letters, digits and - . _ ~ only (it goes into the store URL unescaped)" }}
{{- end }}
{{- if lt (int .bundled.terminationGracePeriodSeconds) 20 }}
{{- $problems = append $problems "store.bundled.terminationGracePeriodSeconds must be at least 20 (pg_ctl stop gets all but 10 s of it)" }}
{{- end }}
{{- end }}
{{- if and .Values.gateway.loginKeys.existingSecret .Values.gateway.loginKeys.existingConfigMap }}
{{- $problems = append $problems "gateway.loginKeys: set either existingSecret or existingConfigMap, not both" }}
{{- end }}
{{- if and .Values.resumeKey.value .Values.resumeKey.existingSecret }}
{{- $problems = append $problems "resumeKey: set either resumeKey.value or resumeKey.existingSecret, not both" }}
{{- end }}
{{- if and (not .Values.cluster.dev) (not .Values.resumeKey.value) (not .Values.resumeKey.existingSecret) }}
{{- $problems = append $problems "resumeKey: outside dev mode the cluster needs a resume key: set resumeKey.value (e.g. --set resumeKey.value=$(openssl rand -hex 32)) or resumeKey.existingSecret" }}
{{- end }}
{{- if and .Values.adminToken.value .Values.adminToken.existingSecret }}
{{- $problems = append $problems "adminToken: set either adminToken.value or adminToken.existingSecret, not both" }}
{{- end }}
{{- with .Values.grpcTls }}
{{- if ne .mode "disabled" }}
{{- if gt (int $.Values.shard.replicas) (int .maxNodes) }}
{{- $problems = append $problems (printf "grpcTls.maxNodes %d is below shard.replicas %d: shards past it would have no certificate" (int .maxNodes) (int $.Values.shard.replicas)) }}
{{- end }}
{{- $gateways := $.Values.gateway.replicas }}
{{- if $.Values.gateway.autoscaling.enabled }}
{{- $gateways = $.Values.gateway.autoscaling.maxReplicas }}
{{- end }}
{{- if gt (int $gateways) (int .maxNodes) }}
{{- $problems = append $problems (printf "grpcTls.maxNodes %d is below the gateways' %d (replicas, or autoscaling.maxReplicas): gateways past it would have no certificate" (int .maxNodes) (int $gateways)) }}
{{- end }}
{{- end }}
{{- if and (eq .mode "existingSecret") (not .existingSecret) }}
{{- $problems = append $problems "grpcTls.mode existingSecret needs grpcTls.existingSecret" }}
{{- end }}
{{- if and (eq .mode "certManager") (not .certManager.issuerRef.name) }}
{{- $problems = append $problems "grpcTls.mode certManager needs grpcTls.certManager.issuerRef.name" }}
{{- end }}
{{- end }}
{{- if and .Values.resumeKey.previous .Values.resumeKey.existingSecret }}
{{- $problems = append $problems "resumeKey.previous: with resumeKey.existingSecret, put the previous keys in that Secret (key resume-key-previous)" }}
{{- end }}
{{- if and .Values.resumeKey.value (not (regexMatch "^([0-9a-fA-F]{2}){16,}$" .Values.resumeKey.value)) }}
{{- $problems = append $problems "resumeKey.value must be hex with an even number of digits, at least 32 (e.g. openssl rand -hex 32)" }}
{{- end }}
{{- if and (eq .Values.gateway.seccompProfile.type "Localhost") (not .Values.gateway.seccompProfile.localhostProfile) }}
{{- $problems = append $problems "gateway.seccompProfile: type Localhost needs localhostProfile (the path of deploy/seccomp-io-uring.json under the kubelet's seccomp directory)" }}
{{- end }}
{{- if and (ne .Values.gateway.seccompProfile.type "Localhost") .Values.gateway.seccompProfile.localhostProfile }}
{{- $problems = append $problems "gateway.seccompProfile: localhostProfile is only valid with type Localhost" }}
{{- end }}
{{- if and .Values.gateway.autoscaling.enabled (gt (int .Values.gateway.autoscaling.minReplicas) (int .Values.gateway.autoscaling.maxReplicas)) }}
{{- $problems = append $problems "gateway.autoscaling: minReplicas must not exceed maxReplicas" }}
{{- end }}
{{- if lt (int64 .Values.gateway.maxOutputBytes) (mul 4 (int64 .Values.gateway.maxFrameBytes)) }}
{{- $problems = append $problems "gateway.maxOutputBytes must be at least 4 x gateway.maxFrameBytes" }}
{{- end }}
{{- if lt (int .Values.shard.terminationGracePeriodSeconds) (add (int .Values.shard.drainTimeoutSeconds) 15) }}
{{- $problems = append $problems "shard.terminationGracePeriodSeconds must be at least shard.drainTimeoutSeconds + 15" }}
{{- end }}
{{- if eq (int .Values.cluster.adminPort) (int .Values.gateway.port) }}
{{- $problems = append $problems "cluster.adminPort and gateway.port must differ" }}
{{- end }}
{{- with .Values.gateway.quic }}
{{- if and .enabled (not .tlsSecret) (not $.Values.cluster.dev) }}
{{- $problems = append $problems "gateway.quic: outside dev mode the QUIC front needs a certificate: set gateway.quic.tlsSecret to a kubernetes.io/tls Secret (tls.crt, tls.key)" }}
{{- end }}
{{- if gt (mul 2 (int64 .keepAliveMs)) (int64 .idleTimeoutMs) }}
{{- $problems = append $problems "gateway.quic.keepAliveMs must be at most half of gateway.quic.idleTimeoutMs" }}
{{- end }}
{{- end }}
{{- if eq (int .Values.cluster.adminPort) (int .Values.shard.grpcPort) }}
{{- $problems = append $problems "cluster.adminPort and shard.grpcPort must differ" }}
{{- end }}
{{- with .Values.metrics }}
{{- if and .serviceMonitor.enabled .podMonitor.enabled }}
{{- $problems = append $problems "metrics: enable serviceMonitor or podMonitor, not both (every target would be scraped twice)" }}
{{- end }}
{{- range $kind := list "serviceMonitor" "podMonitor" }}
{{- $monitor := index $.Values.metrics $kind }}
{{- if and $monitor.enabled $monitor.interval $monitor.scrapeTimeout }}
{{- if gt (int64 (include "meridian.durationMs" $monitor.scrapeTimeout)) (int64 (include "meridian.durationMs" $monitor.interval)) }}
{{- $problems = append $problems (printf "metrics.%s.scrapeTimeout %s must not exceed its interval %s" $kind $monitor.scrapeTimeout $monitor.interval) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $problems }}
{{- fail (printf "\n\nmeridian: invalid values:\n  - %s\n" (join "\n  - " $problems)) }}
{{- end }}
{{- end }}

{{/*
gRPC mutual TLS (grpcTls in values.yaml). The Secret of one kind's certificates (generated or
existingSecret mode): meridian.grpcTls.secretName (dict "ctx" . "kind" "shard").
*/}}
{{- define "meridian.grpcTls.secretName" -}}
{{- if eq .ctx.Values.grpcTls.mode "existingSecret" }}
{{- .ctx.Values.grpcTls.existingSecret }}
{{- else }}
{{- printf "%s-grpc-tls-%s" (include "meridian.fullname" .ctx) .kind }}
{{- end }}
{{- end }}

{{/* The flags a node of `kind` starts with, for the shell that knows its id as $ID. */}}
{{- define "meridian.grpcTls.flags" -}}
{{- $dir := "/etc/meridian/grpc-tls" }}
{{- $mode := .ctx.Values.grpcTls.mode }}
{{- if eq $mode "disabled" -}}
--insecure-grpc
{{- else if eq $mode "certManager" -}}
--tls-ca "{{ $dir }}/{{ .kind }}-$ID-ca.pem" --tls-cert "{{ $dir }}/{{ .kind }}-$ID.pem" --tls-key "{{ $dir }}/{{ .kind }}-$ID-key.pem"
{{- else -}}
--tls-ca "{{ $dir }}/ca.pem" --tls-cert "{{ $dir }}/{{ .kind }}-$ID.pem" --tls-key "{{ $dir }}/{{ .kind }}-$ID-key.pem"
{{- end }}
{{- end }}

{{/* The volume mount of the certificates (nothing when disabled). */}}
{{- define "meridian.grpcTls.mount" -}}
{{- if ne .Values.grpcTls.mode "disabled" -}}
# The whole volume, never a subPath: a renewed Secret then replaces the files, which the
# node reads again for its next connection.
- name: grpc-tls
  mountPath: /etc/meridian/grpc-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The volume of one kind's certificates (nothing when disabled). */}}
{{- define "meridian.grpcTls.volume" -}}
{{- $tls := .ctx.Values.grpcTls }}
{{- if eq $tls.mode "certManager" -}}
- name: grpc-tls
  projected:
    defaultMode: 0440
    sources:
      {{- range $i := until (int $tls.maxNodes) }}
      {{- $name := printf "%s-%d" $.kind (add1 $i) }}
      - secret:
          name: {{ printf "%s-grpc-%s" (include "meridian.fullname" $.ctx) $name }}
          optional: true
          items:
            - key: tls.crt
              path: {{ $name }}.pem
            - key: tls.key
              path: {{ $name }}-key.pem
            - key: ca.crt
              path: {{ $name }}-ca.pem
      {{- end }}
{{- else if ne $tls.mode "disabled" -}}
- name: grpc-tls
  secret:
    secretName: {{ include "meridian.grpcTls.secretName" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/*
etcd with TLS and authentication. The Secret holding the client side's files (ca.pem, and
client.pem / client-key.pem), or nothing for plain etcd.
*/}}
{{- define "meridian.etcdClient.secret" -}}
{{- if .Values.etcd.bundled.enabled }}
{{- if .Values.etcd.bundled.security.enabled }}
{{- printf "%s-etcd-client" (include "meridian.fullname" .) }}
{{- end }}
{{- else }}
{{- .Values.etcd.external.tlsSecret }}
{{- end }}
{{- end }}

{{/* Whether an external etcd's Secret has a client certificate: looked up in the cluster
(`helm template` cannot, and assumes it has). */}}
{{- define "meridian.etcdClient.hasCert" -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace .Values.etcd.external.tlsSecret }}
{{- if or (not $secret) (and $secret.data (hasKey $secret.data "client.pem")) }}true{{ end }}
{{- end }}

{{/* The etcd user Meridian's nodes log in as, or nothing. */}}
{{- define "meridian.etcdUser" -}}
{{- if .Values.etcd.bundled.enabled }}
{{- if .Values.etcd.bundled.security.enabled }}meridian{{ end }}
{{- else }}
{{- .Values.etcd.external.user }}
{{- end }}
{{- end }}

{{/* The etcd user's password, from its Secret. */}}
{{- define "meridian.env.etcdPassword" -}}
{{- if include "meridian.etcdUser" . -}}
- name: MERIDIAN_ETCD_PASSWORD
  valueFrom:
    secretKeyRef:
      {{- if .Values.etcd.bundled.enabled }}
      name: {{ include "meridian.fullname" . }}-etcd-auth
      key: meridian-password
      {{- else }}
      name: {{ .Values.etcd.external.passwordSecret }}
      key: password
      {{- end }}
{{- end }}
{{- end }}

{{/* The mount and the volume of the etcd client files (nothing for plain etcd). */}}
{{- define "meridian.etcdClient.mount" -}}
{{- if include "meridian.etcdClient.secret" . -}}
- name: etcd-client
  mountPath: /etc/meridian/etcd-client
  readOnly: true
{{- end }}
{{- end }}
{{- define "meridian.etcdClient.volume" -}}
{{- with include "meridian.etcdClient.secret" . -}}
- name: etcd-client
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/*
Monitoring (metrics.* in values.yaml). The components a ServiceMonitor or PodMonitor scrapes,
as a YAML flow list: gateways and shards on their admin port, the bundled etcd on its
metrics port.
*/}}
{{- define "meridian.metrics.components" -}}
{{- $components := list "gateway" "shard" }}
{{- if .Values.etcd.bundled.enabled }}
{{- $components = append $components "etcd" }}
{{- end }}
{{- toJson $components }}
{{- end }}

{{/*
The scrape endpoints of a ServiceMonitor or a PodMonitor (the same fields in both):
(dict "ctx" $ "monitor" <its values>). Each target's job becomes <prefix>-<component>
whichever monitor found it, so the alerts and the dashboard need not know which one it was.
*/}}
{{- define "meridian.metrics.endpoints" -}}
{{- $ports := list "admin" }}
{{- if .ctx.Values.etcd.bundled.enabled }}
{{- $ports = append $ports "metrics" }}
{{- end }}
{{- range $ports }}
- port: {{ . }}
  path: /metrics
  {{- with $.monitor.interval }}
  interval: {{ . }}
  {{- end }}
  {{- with $.monitor.scrapeTimeout }}
  scrapeTimeout: {{ . }}
  {{- end }}
  relabelings:
    - sourceLabels:
        - __meta_kubernetes_pod_label_app_kubernetes_io_component
      targetLabel: job
      replacement: {{ printf "%s-${1}" (include "meridian.fullname" $.ctx) | quote }}
{{- end }}
{{- end }}

{{/* The selector of the pods (PodMonitor) or Services (ServiceMonitor) to scrape. */}}
{{- define "meridian.metrics.selector" -}}
namespaceSelector:
  matchNames:
    - {{ .Release.Namespace }}
selector:
  matchLabels:
    {{- include "meridian.selectorLabels" (dict "ctx" .) | nindent 4 }}
  matchExpressions:
    - key: app.kubernetes.io/component
      operator: In
      values: {{ include "meridian.metrics.components" . }}
{{- end }}

{{/* A Prometheus duration (30s, 1m30s, 500ms) in milliseconds, for comparing two. */}}
{{- define "meridian.durationMs" -}}
{{- $ms := 0 }}
{{- $unit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 }}
{{- $digits := regexFind "^[0-9]+" . }}
{{- $ms = add $ms (mul (int64 $digits) (get $unit (trimPrefix $digits .))) }}
{{- end }}
{{- $ms }}
{{- end }}
