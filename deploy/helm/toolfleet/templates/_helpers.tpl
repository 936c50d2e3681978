{{/* The name of every object: <release>-toolfleet-<part>. */}}
{{- define "toolfleet.name" -}}
{{- printf "%s-toolfleet" .Release.Name | trunc 53 | trimSuffix "-" -}}
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

{{/* The connection settings every toolfleet container shares. */}}
{{- define "toolfleet.connectionEnv" -}}
- name: TOOLFLEET_NATS__URL
  value: {{ .Values.nats.url | quote }}
- name: TOOLFLEET_REDIS__URL
  value: {{ .Values.redis.url | quote }}
- name: TOOLFLEET_LOG__FORMAT
  value: json
{{- with .Values.telemetry }}
{{- if .otlpEndpoint }}
- name: TOOLFLEET_TELEMETRY__OTLP_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
- name: TOOLFLEET_TELEMETRY__OTLP_PROTOCOL
  value: {{ .otlpProtocol | quote }}
- name: TOOLFLEET_TELEMETRY__SAMPLE_RATIO
  value: {{ .sampleRatio | quote }}
{{- end }}
{{- end }}
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
