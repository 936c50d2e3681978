{{/* The name every object's starts with: <release>-toolfleet, or <fullnameOverride>. */}}
{{- define "toolfleet.name" -}}
{{- .Values.fullnameOverride | default (printf "%s-toolfleet" .Release.Name) | trunc 53 | trimSuffix "-" -}}
{{- end -}}

{{/*
The name of the object .part of the release (.root): <name>-<part>. A
Service's name is a DNS label, so no name is over 63 characters: a longer
one keeps its first 54 and ends with 8 hex digits of its whole's SHA-256,
which keeps two long names that differ only at the end apart.
*/}}
{{- define "toolfleet.object" -}}
{{- $full := printf "%s-%s" (include "toolfleet.name" .root) .part -}}
{{- if gt (len $full) 63 -}}
{{- printf "%s-%s" ($full | trunc 54 | trimSuffix "-") ($full | sha256sum | trunc 8) -}}
{{- else -}}
{{- $full -}}
{{- end -}}
{{- end -}}

{{- define "toolfleet.labels" -}}
app.kubernetes.io/name: toolfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "toolfleet.selector" -}}
app.kubernetes.io/name: toolfleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "toolfleet.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{ include "toolfleet.name" . }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{/* Every tool of every pool: the setup step creates their consumers. */}}
{{- define "toolfleet.tools" -}}
{{- $tools := list -}}
{{- range .Values.pools }}{{ $tools = concat $tools .tools }}{{ end -}}
{{- $tools | uniq | join "," -}}
{{- end -}}

{{/*
A service's probes: HTTP on its plaintext metrics port (named `metrics`),
which answers /healthz while the process runs (even while it waits for a
server) and /readyz once it serves (docs/deploy.md). No process is forked
per probe, and it works whether or not the gRPC port speaks TLS. The
startup probe holds the liveness probe off until the endpoint is up.
*/}}
{{- define "toolfleet.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 1
  failureThreshold: 60
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{/* Who may scrape the metrics ports: networkPolicy.metricsFrom, or every
pod of the cluster when it is empty (never a source outside it). */}}
{{- define "toolfleet.metricsFrom" -}}
{{- with .Values.networkPolicy.metricsFrom -}}
{{- toYaml . -}}
{{- else -}}
- namespaceSelector: {}
{{- end -}}
{{- end -}}

{{/*
The pod settings of a role (.own: orchestrator.pod, a pool's pod): the
global `pod`, each key the role sets replacing the global one whole (a
role's nodeSelector is its nodeSelector, not merged into the global one).
*/}}
{{- define "toolfleet.podSettings" -}}
{{- $settings := deepCopy (.root.Values.pod | default dict) -}}
{{- range $key, $value := (.own | default dict) -}}
{{- $_ := set $settings $key $value -}}
{{- end -}}
{{- toYaml $settings -}}
{{- end -}}

{{/*
The scheduling and security of a pod (.pod, its settings): pull secrets,
its securityContext (the chart's restricted one unless the settings carry
their own, e.g. {} on OpenShift, whose SCC assigns the user), its priority
class, node selector, tolerations, affinity and spread.
*/}}
{{- define "toolfleet.podCommon" -}}
{{- $pod := .pod -}}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
securityContext:
{{- if hasKey $pod "securityContext" }}
  {{- toYaml $pod.securityContext | nindent 2 }}
{{- else }}
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
{{- end }}
{{- with $pod.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- range $key := list "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" }}
{{- with index $pod $key }}
{{ $key }}:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A toolfleet image (.which: orchestrator or worker): its registry and
name, then its digest when one is pinned, else the tag. */}}
{{- define "toolfleet.image" -}}
{{- $image := .root.Values.image -}}
{{- $name := index $image .which -}}
{{- with $image.registry }}{{ $name = printf "%s/%s" (trimSuffix "/" .) $name }}{{ end -}}
{{- with index ($image.digests | default dict) .which -}}
{{ $name }}@{{ . }}
{{- else -}}
{{ $name }}:{{ $image.tag }}
{{- end -}}
{{- end -}}

{{/* A container's securityContext: the settings' own (.pod), or the
chart's restricted one. */}}
{{- define "toolfleet.containerSecurityOf" -}}
{{- if hasKey .pod "containerSecurityContext" -}}
{{- toYaml .pod.containerSecurityContext -}}
{{- else -}}
{{- include "toolfleet.containerSecurity" .root -}}
{{- end -}}
{{- end -}}

{{/* The restricted security context every container runs with. */}}
{{- define "toolfleet.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Where NATS and Redis are: the chart's own servers with dev.enabled. */}}
{{- define "toolfleet.natsURL" -}}
{{- if .Values.dev.enabled -}}
nats://{{ include "toolfleet.object" (dict "root" . "part" "nats") }}:4222
{{- else -}}
{{ .Values.nats.url }}
{{- end -}}
{{- end -}}

{{- define "toolfleet.redisURL" -}}
{{- if .Values.dev.enabled -}}
redis://{{ include "toolfleet.object" (dict "root" . "part" "redis") }}:6379/
{{- else -}}
{{ .Values.redis.url }}
{{- end -}}
{{- end -}}

{{/* host:port of the NATS monitoring endpoint KEDA reads, by a name that
resolves from KEDA's namespace: the Service's full DNS name. */}}
{{- define "toolfleet.natsMonitoring" -}}
{{- $m := .Values.keda.natsMonitoring -}}
{{- if .Values.dev.enabled -}}
{{ include "toolfleet.object" (dict "root" . "part" "nats") }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:8222
{{- else -}}
{{ $m.service }}.{{ $m.namespace | default .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:{{ $m.port }}
{{- end -}}
{{- end -}}

{{- define "toolfleet.credentialsSecret" -}}
{{- .Values.credentials.existingSecret | default (include "toolfleet.object" (dict "root" . "part" "credentials")) -}}
{{- end -}}

{{/* A NATS user's password in its users file (.user, with .hashes the
bcrypt hashes known): the hash itself, quoted, or where none is known a
reference to the server's environment. */}}
{{- define "toolfleet.natsPassword" -}}
{{- with get .hashes .user -}}
"{{ . }}"
{{- else -}}
${{ include "toolfleet.natsPasswordVar" .user }}
{{- end -}}
{{- end -}}

{{/* Every NATS user: setup, orchestrator and one per pool. */}}
{{- define "toolfleet.natsUsers" -}}
{{- $users := list "setup" "orchestrator" -}}
{{- range .Values.pools }}{{ $users = append $users (printf "pool-%s" .name) }}{{ end -}}
{{- $users | join "," -}}
{{- end -}}

{{/* The environment variable the NATS server reads a user's password's
bcrypt hash from. */}}
{{- define "toolfleet.natsPasswordVar" -}}
TOOLFLEET_NATS_{{ . | upper | replace "-" "_" }}_PASSWORD_BCRYPT
{{- end -}}

{{/*
The configuration every service of role .user shares (a YAML map): where
NATS and Redis are and which users it logs in as (their passwords come
from the credentials Secret, in the environment), JSON logs, and where
traces and metrics go. Setup leaves Redis out: it never connects to it.
*/}}
{{- define "toolfleet.baseConfig" -}}
{{- $v := .root.Values -}}
log:
  format: json
nats:
  url: {{ include "toolfleet.natsURL" .root | quote }}
  # Only the setup Job creates JetStream objects.
  create_missing: false
  replicas: {{ if $v.dev.enabled }}1{{ else }}{{ $v.nats.replicas }}{{ end }}
  {{- if eq $v.nats.auth "users" }}
  user: {{ .user | quote }}
  inbox_prefix: {{ printf "_INBOX.%s" .user | quote }}
  {{- if hasPrefix "pool-" .user }}
  # The pool's own NATS account imports the JetStream API under this prefix.
  api_prefix: "JS.toolfleet.API"
  {{- end }}
  {{- end }}
  {{- include "toolfleet.tlsConfig" (dict "tls" $v.nats.tls "dir" "/etc/toolfleet/nats-tls") | nindent 2 }}
{{- if ne .user "setup" }}
redis:
  url: {{ include "toolfleet.redisURL" .root | quote }}
  cluster: {{ and $v.redis.cluster (not $v.dev.enabled) }}
  wait_replicas: {{ if $v.dev.enabled }}0{{ else }}{{ $v.redis.waitReplicas }}{{ end }}
  {{- if eq $v.redis.auth "users" }}
  user: {{ .user | quote }}
  {{- end }}
  {{- include "toolfleet.tlsConfig" (dict "tls" $v.redis.tls "dir" "/etc/toolfleet/redis-tls") | nindent 2 }}
{{- with $v.telemetry }}
{{- if .otlpEndpoint }}
telemetry:
  otlp_endpoint: {{ .otlpEndpoint | quote }}
  otlp_protocol: {{ .otlpProtocol | quote }}
  sample_ratio: {{ .sampleRatio }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The environment of a service of role .user: its config file, and its
NATS and Redis passwords from the credentials Secret.
*/}}
{{- define "toolfleet.env" -}}
{{- $v := .root.Values -}}
- name: TOOLFLEET_CONFIG
  value: /etc/toolfleet/config/config.toml
{{- if eq $v.nats.auth "users" }}
- name: TOOLFLEET_NATS__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "toolfleet.credentialsSecret" .root }}
      key: nats-{{ .user }}
{{- end }}
{{- if and (eq $v.redis.auth "users") (ne .user "setup") }}
- name: TOOLFLEET_REDIS__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "toolfleet.credentialsSecret" .root }}
      key: redis-{{ .user }}
{{- end }}
{{- end -}}

{{/* The `tls` table of nats or redis, from its Secret mounted at .dir. */}}
{{- define "toolfleet.tlsConfig" -}}
{{- if .tls.secretName -}}
tls:
  ca_file: {{ printf "%s/ca.crt" .dir }}
  {{- if .tls.clientCert }}
  cert_file: {{ printf "%s/tls.crt" .dir }}
  key_file: {{ printf "%s/tls.key" .dir }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* The mounts of a service of role .user: its config file, and the TLS
Secrets of NATS and (but for setup) Redis. */}}
{{- define "toolfleet.mounts" -}}
- name: config
  mountPath: /etc/toolfleet/config
  readOnly: true
{{- if .root.Values.nats.tls.secretName }}
- name: nats-tls
  mountPath: /etc/toolfleet/nats-tls
  readOnly: true
{{- end }}
{{- if and .root.Values.redis.tls.secretName (ne .user "setup") }}
- name: redis-tls
  mountPath: /etc/toolfleet/redis-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* The config volume of a service: its own file of the ConfigMap
(.configMap, or the release's config). */}}
{{- define "toolfleet.configVolume" -}}
- name: config
  configMap:
    name: {{ .configMap | default (include "toolfleet.object" (dict "root" .root "part" "config")) }}
    items:
      - key: {{ .user }}.toml
        path: config.toml
{{- with .root.Values.nats.tls.secretName }}
- name: nats-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- if and .root.Values.redis.tls.secretName (ne .user "setup") }}
- name: redis-tls
  secret:
    secretName: {{ .root.Values.redis.tls.secretName }}
{{- end }}
{{- end -}}

{{/*
Renders the map .table as TOML (under the table .name; "" at the root).
Written here because Helm's toToml writes every number of the values as
a float (Helm reads them as float64), and toolfleet's integer keys refuse
`32.0`. Scalars and lists first, then sub-tables, as TOML requires.
*/}}
{{- define "toolfleet.toml" -}}
{{- $name := .name -}}
{{- range $key, $value := .table }}
{{- if not (or (kindIs "map" $value) (kindIs "invalid" $value)) }}
{{ include "toolfleet.tomlKey" $key }} = {{ include "toolfleet.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := .table }}
{{- if kindIs "map" $value }}
{{- $table := include "toolfleet.tomlKey" $key }}
{{- if $name }}{{ $table = printf "%s.%s" $name $table }}{{ end }}

[{{ $table }}]
{{- include "toolfleet.toml" (dict "name" $table "table" $value) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "toolfleet.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end -}}
{{- end -}}

{{- define "toolfleet.tomlValue" -}}
{{- if kindIs "float64" . -}}
{{- if eq . (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- else if kindIs "slice" . -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "toolfleet.tomlValue" $v }}{{ end }}]
{{- else if kindIs "map" . -}}
{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }},{{ end }} {{ include "toolfleet.tomlKey" $k }} = {{ include "toolfleet.tomlValue" (get $ $k) }}{{ end }} }
{{- else if kindIs "string" . -}}
{{ toJson . }}
{{- else -}}
{{ . }}
{{- end -}}
{{- end -}}

{{/* Where the services may connect: DNS, and the configured ports. */}}
{{- define "toolfleet.egress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
- ports:
    {{- range .Values.networkPolicy.egressPorts }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end -}}

{{/*
toolfleet's NATS users (docs/security.md, decision 0012), generated from
the pools: setup, orchestrator, and one user per pool that may pull, ack
and register exactly its own tools.
*/}}
{{- define "toolfleet.natsUsersConf" -}}
{{- $hashes := .hashes | default dict -}}
{{- $root := .root -}}
{{- /* Each tool's pools (a tool may be served by several), in pool order. */ -}}
{{- $servers := dict -}}
{{- $tools := list -}}
{{- range $root.Values.pools -}}
{{- $account := printf "pool-%s" .name -}}
{{- range .tools -}}
{{- if not (hasKey $servers .) -}}{{- $tools = append $tools . -}}{{- end -}}
{{- $_ := set $servers . (append (get $servers . | default list) $account) -}}
{{- end -}}
{{- end -}}
# toolfleet's NATS accounts and users, each with the least it needs
# (docs/security.md, decisions 0012 and 0029), rendered by the Helm chart
# from its pools (deploy/helm/toolfleet, templates/credentials.yaml). There
# is no anonymous user: a client without credentials is refused. The
# server knows only the passwords' bcrypt hashes: written here (the Helm
# chart's Secret, which a server reloads with a new pool), or, as a
# variable this file does not define, from its environment: each such
# variable holds the hash in double quotes, "$2a$11$...", since nats-server
# reads a variable's value as configuration, where an unquoted $ starts a
# variable reference (make one with `htpasswd -bnBC 11 "" "$PASSWORD" | tr
# -d ':\n'` or `nats server passwd`).
#
# Accounts are what keep the pools apart. nats-server checks a publisher's
# right to a message's subject, never to its reply subject, and JetStream
# answers a request (or delivers a pulled call) on the reply subject the
# requester chose. So every pool has an account of its own, where it can
# only reach what the account `toolfleet` exports to it: its own tools'
# consumers and acks, its own tools' registry keys, and the reply subjects.
# An answer to a pool's request goes back into the pool's own account,
# whatever reply subject it names: it can never land in a call queue, the
# job queue, the registry or another user's inbox.
#
# Each user has its own inbox prefix (nats.inbox_prefix = "_INBOX.<user>")
# and may subscribe only there. Services run with nats.create_missing =
# false: only `setup` creates streams, consumers and the registry bucket.
# To add a pool, add it to the chart's values (or render this file with
# it); `toolfleet-orchestrator setup` then creates its tools' consumers.

accounts {
  # The streams, the consumers, the registry and the orchestrators.
  toolfleet: {
    jetstream: enabled
    users: [
      # `toolfleet-orchestrator setup`: the one privileged step. It creates
      # and updates the streams, consumers and the registry bucket; run it
      # as a job, not as a service.
      {
        user: setup
        password: {{ include "toolfleet.natsPassword" (dict "user" "setup" "hashes" $hashes) }}
        permissions: {
          publish: { allow: ["$JS.API.>"] }
          subscribe: { allow: ["_INBOX.setup.>"] }
        }
      }

      # The orchestrators: publish calls and jobs, read replies, pull jobs,
      # wake job watchers, follow the registry. No right to create anything,
      # nor to pull or read calls.
      {
        user: orchestrator
        password: {{ include "toolfleet.natsPassword" (dict "user" "orchestrator" "hashes" $hashes) }}
        permissions: {
          publish: {
            allow: [
              "toolfleet.call.*"
              "toolfleet.job.run"
              "toolfleet.events.*"
              "$JS.API.STREAM.INFO.TOOLFLEET_JOBS"
              "$JS.API.CONSUMER.INFO.TOOLFLEET_JOBS.orchestrators"
              "$JS.API.CONSUMER.MSG.NEXT.TOOLFLEET_JOBS.orchestrators"
              # Each tool's backlog (toolfleet_tool_calls_waiting): state only.
              "$JS.API.CONSUMER.INFO.TOOLFLEET_CALLS.*"
              "$JS.ACK.TOOLFLEET_JOBS.orchestrators.>"
              "$JS.API.STREAM.INFO.KV_toolfleet_registry"
              "$JS.API.CONSUMER.CREATE.KV_toolfleet_registry"
              "$JS.API.CONSUMER.CREATE.KV_toolfleet_registry.>"
              "$JS.API.CONSUMER.DELETE.KV_toolfleet_registry.>"
              "$JS.FC.KV_toolfleet_registry.>"
            ]
          }
          subscribe: {
            allow: ["toolfleet.reply.*", "toolfleet.events.*", "_INBOX.orchestrator.>"]
          }
        }
      }
    ]
    # What a pool may reach here, each to the pools that serve the tool.
    # MSG.NEXT answers with a stream of calls; every other export answers
    # once (a consumer's state, a registry write's ack) or not at all.
    exports: [
      {{- range $tools }}
      {{- $to := printf "[\"%s\"]" (get $servers . | join "\", \"") }}
      { service: "$JS.API.CONSUMER.INFO.TOOLFLEET_CALLS.tool_{{ . }}", accounts: {{ $to }} }
      { service: "$JS.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_{{ . }}", response_type: stream, accounts: {{ $to }} }
      { service: "$JS.ACK.TOOLFLEET_CALLS.tool_{{ . }}.>", accounts: {{ $to }} }
      { service: "$KV.toolfleet_registry.{{ . }}.>", accounts: {{ $to }} }
      {{- end }}
      { service: "toolfleet.reply.*", accounts: [{{ range $i, $pool := $root.Values.pools }}{{ if $i }}, {{ end }}"pool-{{ $pool.name }}"{{ end }}] }
    ]
  }
  {{- range $root.Values.pools }}
  {{- $user := printf "pool-%s" .name }}

  # Worker pool "{{ .name }}": {{ join ", " .tools }}. Its account has no
  # JetStream of its own and nothing but what it imports. The JetStream
  # API comes in under the prefix JS.toolfleet.API (nats.api_prefix), since
  # the server answers $JS.API itself in an account without JetStream.
  "{{ $user }}": {
    users: [
      {
        user: {{ $user }}
        password: {{ include "toolfleet.natsPassword" (dict "user" $user "hashes" $hashes) }}
        permissions: {
          publish: {
            allow: [
              "toolfleet.reply.*"
              {{- range .tools }}
              "JS.toolfleet.API.CONSUMER.INFO.TOOLFLEET_CALLS.tool_{{ . }}"
              "JS.toolfleet.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_{{ . }}"
              "$JS.ACK.TOOLFLEET_CALLS.tool_{{ . }}.>"
              "$KV.toolfleet_registry.{{ . }}.>"
              {{- end }}
            ]
          }
          subscribe: { allow: ["_INBOX.{{ $user }}.>"] }
        }
      }
    ]
    imports: [
      {{- range .tools }}
      { service: { account: toolfleet, subject: "$JS.API.CONSUMER.INFO.TOOLFLEET_CALLS.tool_{{ . }}" }, to: "JS.toolfleet.API.CONSUMER.INFO.TOOLFLEET_CALLS.tool_{{ . }}" }
      { service: { account: toolfleet, subject: "$JS.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_{{ . }}" }, to: "JS.toolfleet.API.CONSUMER.MSG.NEXT.TOOLFLEET_CALLS.tool_{{ . }}" }
      { service: { account: toolfleet, subject: "$JS.ACK.TOOLFLEET_CALLS.tool_{{ . }}.>" } }
      { service: { account: toolfleet, subject: "$KV.toolfleet_registry.{{ . }}.>" } }
      {{- end }}
      { service: { account: toolfleet, subject: "toolfleet.reply.*" } }
    ]
  }
  {{- end }}
}
{{- end -}}

{{/*
toolfleet's Redis ACL users (docs/security.md, decision 0013), generated
from the pools, and the console's with .console; .hashes maps a user to
its password's SHA-256 (hex).
*/}}
{{- define "toolfleet.redisUsersConf" -}}
{{- $hashes := .hashes -}}
# toolfleet's Redis users, each allowed only the keys and commands it needs
# (docs/security.md, decision 0013), rendered by the Helm chart from its
# pools (deploy/helm/toolfleet, templates/credentials.yaml). Include it from
# redis.conf (`include /etc/redis/toolfleet-users.conf`; redis-server 7.0 or
# newer; not with an `aclfile`, which holds users instead). Passwords are
# stored as SHA-256 hashes: in deploy/redis, replace each
# @..._PASSWORD_SHA256@ with `printf %s "$PASSWORD" | sha256sum` (the Helm
# chart does this from its Secret). The patterns assume the default key
# prefix `tf` (redis.key_prefix).
#
# Key layout (proto/src/names.rs): a job's keys share the hash tag
# {<job_id>}; a call's ledger lives under its tool,
# tf:{<job_id>}:tool:<tool>:{claim,started,claims,checkpoint,cancelled,result}:<call>:<attempt>.
# Tool names and call ids never hold `{`, `}` or `:`, so one tool's pattern
# never matches another tool's key.
#
# Commands: reads, writes and scripts (the services speak through Lua
# scripts, whose keys are checked against the patterns too), TIME for the
# orchestrators (the tenants' quotas run on Redis's clock), nothing
# @dangerous (KEYS, FLUSHALL, CONFIG, DEBUG, ...), no functions, and no
# SCRIPT FLUSH or KILL. No pub/sub channels. No SCAN or RANDOMKEY either:
# key patterns do not filter the names they return, so they would list
# every key, other pools' call ids among them. CLUSTER SLOTS alone of the
# cluster commands: a Redis Cluster client learns the slots' nodes with it.
{{ if eq .defaultUser "keep" }}
# The default user is left as this Redis configures it (redis.defaultUser:
# keep): a Redis chart's own probes and replication log in with it.
{{- else }}
# Nobody connects without a user.
user default off
{{- end }}

# The orchestrators: every job key, the tenants' indexes, quotas, period budgets
# (tf:budget:{<tenant>}) and result caches (tf:cache:{<tenant>}:*), the submission keys, the
# tools' circuit breakers (tf:breaker:<tool>); the call ledgers read-only (a result is only ever
# written by the pool that ran the call).
user orchestrator on #{{ get $hashes "orchestrator" }} resetchannels ~tf:{*}:job ~tf:{*}:items ~tf:{*}:events ~tf:{*}:attempts ~tf:{*}:tools ~tf:{*}:lease ~tf:{*}:approvals ~tf:{*}:shaped ~tf:unfinished:* ~tf:parked:* ~tf:approvals:* ~tf:catalog ~tf:jobs:* ~tf:active:* ~tf:calls:* ~tf:rate:* ~tf:idem:* ~tf:cache:* ~tf:budget:* ~tf:breaker:* %R~tf:{*}:tool:* -@all +@read +@write +@scripting +@connection +@transaction +time -@dangerous -keys -scan -randomkey -function -script|flush -script|kill +cluster|slots
{{- range .pools }}
{{- $user := printf "pool-%s" .name }}

# Worker pool "{{ .name }}": the ledgers of {{ join ", " .tools }}.
user {{ $user }} on #{{ get $hashes $user }} resetchannels{{ range .tools }} ~tf:{*}:tool:{{ . }}:*{{ end }} -@all +@read +@write +@scripting +@connection -@dangerous -keys -scan -randomkey -function -script|flush -script|kill +cluster|slots
{{- end }}
{{- if .console }}

# The web console (console.enabled): its sessions and the sign-ins under
# way (tf:console:session:*, tf:console:sign-in:*), with exactly the
# commands they take; no job key, no script, nothing to list.
user console on #{{ get $hashes "console" }} resetchannels ~tf:console:* -@all +@connection -@dangerous +hmset +hgetall +expire +del +setex +getdel +multi +exec +discard
{{- end }}
{{- end -}}

{{/*
The setup Job's spec (templates/setup-job.yaml), its configuration from the
ConfigMap .configMap. A plain Job retries a failed pod (the step itself
waits for NATS); as a hook it must end within setup.hookDeadlineSeconds,
inside Helm's --timeout, with its own reason rather than Helm's.
*/}}
{{- define "toolfleet.setupJobSpec" -}}
{{- $root := .root -}}
{{- $pod := include "toolfleet.podSettings" (dict "root" $root) | fromYaml -}}
backoffLimit: 6
{{- if $root.Values.setup.useHelmHooks }}
activeDeadlineSeconds: {{ $root.Values.setup.hookDeadlineSeconds }}
{{- end }}
template:
  metadata:
    labels:
      {{- include "toolfleet.selector" $root | nindent 6 }}
      app.kubernetes.io/component: setup
      {{- with $pod.labels }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- with $pod.annotations }}
    annotations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
  spec:
    serviceAccountName: {{ include "toolfleet.serviceAccount" $root }}
    automountServiceAccountToken: false
    restartPolicy: OnFailure
    {{- include "toolfleet.podCommon" (dict "root" $root "pod" $pod) | nindent 4 }}
    containers:
      - name: setup
        image: {{ include "toolfleet.image" (dict "root" $root "which" "orchestrator") | quote }}
        imagePullPolicy: {{ $root.Values.image.pullPolicy }}
        args: [setup]
        env:
          {{- include "toolfleet.env" (dict "root" $root "user" "setup") | nindent 10 }}
          {{- with $pod.extraEnv }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        resources:
          requests: {cpu: 50m, memory: 32Mi}
          limits: {memory: 128Mi}
        securityContext:
          {{- include "toolfleet.containerSecurityOf" (dict "root" $root "pod" $pod) | nindent 10 }}
        volumeMounts:
          {{- include "toolfleet.mounts" (dict "root" $root "user" "setup") | nindent 10 }}
          {{- with $pod.extraVolumeMounts }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
    volumes:
      {{- include "toolfleet.configVolume" (dict "root" $root "user" "setup" "configMap" .configMap) | nindent 6 }}
      {{- with $pod.extraVolumes }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
{{- end -}}

{{/* Whether `helm test` has a check to run: tests on, a token where the
API wants one, a client certificate where it verifies clients. */}}
{{- define "toolfleet.testable" -}}
{{- $t := .Values.tests -}}
{{- $o := .Values.orchestrator -}}
{{- if and $t.enabled (or (ne $o.auth "tokens") $t.tokenSecret.name) (or (not $o.tls.verifyClients) $t.clientTlsSecret) -}}
true
{{- end -}}
{{- end -}}
