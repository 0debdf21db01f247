{{/* Names, labels and the pieces the FleetWatch containers share. */}}

{{- define "fleetwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleetwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleetwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fleetwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fleetwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include "fleetwatch.componentSelector" (list . "api") */}}
{{- define "fleetwatch.componentSelector" -}}
{{ include "fleetwatch.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "fleetwatch.componentLabels" -}}
{{ include "fleetwatch.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "fleetwatch.image" -}}
{{- $root := index . 0 }}
{{- $override := index . 1 | default dict }}
{{- $repo := $override.repository | default $root.Values.image.repository }}
{{- $tag := $override.tag | default $root.Values.image.tag | default $root.Chart.AppVersion }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{- define "fleetwatch.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "fleetwatch.fullname" .) }}
{{- end }}

{{- define "fleetwatch.tlsSecretName" -}}
{{- .Values.tls.secretName | default (printf "%s-tls" (include "fleetwatch.fullname" .)) }}
{{- end }}

{{- define "fleetwatch.clientTlsSecretName" -}}
{{- .Values.tls.clientSecretName | default (include "fleetwatch.tlsSecretName" .) }}
{{- end }}

{{- define "fleetwatch.postgres" -}}
{{- if eq .Values.database.type "postgresql" }}true{{ else if ne .Values.database.type "sqlite" }}
{{- fail (printf "database.type must be sqlite or postgresql, not %q" .Values.database.type) }}
{{- end }}
{{- end }}

{{/* The API's base URL inside the cluster: the Service's DNS name. */}}
{{- define "fleetwatch.serverUrl" -}}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" .Values.tls.enabled) (include "fleetwatch.fullname" .) .Release.Namespace (int .Values.service.port) }}
{{- end }}

{{/* `fleetwatch --log-level L --log-format F`: the global options before each subcommand. */}}
{{- define "fleetwatch.logArgs" -}}
- --log-level={{ .Values.log.level }}
- --log-format={{ .Values.log.format }}
{{- end }}

{{/* The server container's environment, shared by the api, worker and single pods. */}}
{{- define "fleetwatch.serverEnv" -}}
- name: FLEETWATCH_SERVER_DATABASE_URL
{{- if include "fleetwatch.postgres" . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "fleetwatch.secretName" . }}
      key: database-url
{{- else }}
  value: {{ printf "sqlite:///%s" .Values.database.sqlite.path | quote }}
{{- end }}
- name: FLEETWATCH_SERVER_SECRET_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ include "fleetwatch.secretName" . }}
      key: secret-keys
      optional: true
{{- if .Values.tls.enabled }}
- name: FLEETWATCH_SERVER_TLS_CERT
  value: /etc/fleetwatch/tls/tls.crt
- name: FLEETWATCH_SERVER_TLS_KEY
  value: /etc/fleetwatch/tls/tls.key
{{- if .Values.tls.clientAuth }}
- name: FLEETWATCH_SERVER_TLS_CLIENT_CA
  value: /etc/fleetwatch/tls/ca.crt
{{- end }}
{{- end }}
{{- if .Values.rules }}
- name: FLEETWATCH_SERVER_RULES_FILE
  value: /etc/fleetwatch/rules/rules.toml
{{- end }}
{{- end }}

{{/* Probes of a server container. */}}
{{- define "fleetwatch.serverProbes" -}}
{{- if and .Values.tls.enabled .Values.tls.clientAuth }}
startupProbe:
  tcpSocket:
    port: http
  periodSeconds: 2
  failureThreshold: 90
livenessProbe:
  tcpSocket:
    port: http
  periodSeconds: 10
  failureThreshold: 6
readinessProbe:
  tcpSocket:
    port: http
  periodSeconds: 5
{{- else }}
{{- $scheme := ternary "HTTPS" "HTTP" .Values.tls.enabled }}
startupProbe:
  httpGet:
    path: /healthz
    port: http
    scheme: {{ $scheme }}
  periodSeconds: 2
  failureThreshold: 90
livenessProbe:
  httpGet:
    path: /healthz
    port: http
    scheme: {{ $scheme }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
readinessProbe:
  httpGet:
    path: /readyz
    port: http
    scheme: {{ $scheme }}
  periodSeconds: 5
  timeoutSeconds: 5
{{- end }}
{{- end }}

{{/* Volume mounts and volumes of a server container (rules, TLS, a writable /tmp). */}}
{{- define "fleetwatch.serverMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.rules }}
- name: rules
  mountPath: /etc/fleetwatch/rules
  readOnly: true
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/fleetwatch/tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "fleetwatch.serverVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.rules }}
- name: rules
  configMap:
    name: {{ include "fleetwatch.fullname" . }}
    items:
      - key: rules.toml
        path: rules.toml
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "fleetwatch.tlsSecretName" . }}
{{- end }}
{{- end }}

{{/* The client side of TLS for the agent and k8s-sync: flags, mounts, volumes. */}}
{{- define "fleetwatch.clientTlsArgs" -}}
{{- if .Values.tls.enabled }}
- --ca-bundle=/etc/fleetwatch/tls/ca.crt
{{- if .Values.tls.clientAuth }}
- --client-cert=/etc/fleetwatch/tls/tls.crt
- --client-key=/etc/fleetwatch/tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/* A whole server pod spec; call with (list . role resources). */}}
{{- define "fleetwatch.serverPodSpec" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- $resources := index . 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ include "fleetwatch.fullname" $root }}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with $root.Values.server.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
terminationGracePeriodSeconds: {{ $root.Values.server.terminationGracePeriodSeconds }}
securityContext:
  {{- toYaml $root.Values.server.podSecurityContext | nindent 2 }}
{{- with $root.Values.server.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.server.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: server
    image: {{ include "fleetwatch.image" (list $root dict) }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args:
      {{- include "fleetwatch.logArgs" $root | nindent 6 }}
      - server
      - --role={{ $role }}
      - --host=0.0.0.0
      - --port={{ $root.Values.server.port }}
      {{- if ne $role "all" }}
      - --workers={{ ternary $root.Values.server.api.workers 1 (eq $role "api") }}
      {{- end }}
    ports:
      - name: http
        containerPort: {{ $root.Values.server.port }}
        protocol: TCP
    envFrom:
      - configMapRef:
          name: {{ include "fleetwatch.fullname" $root }}
    env:
      {{- include "fleetwatch.serverEnv" $root | nindent 6 }}
    {{- include "fleetwatch.serverProbes" $root | nindent 4 }}
    resources:
      {{- toYaml $resources | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.server.securityContext | nindent 6 }}
    volumeMounts:
      {{- include "fleetwatch.serverMounts" $root | nindent 6 }}
      {{- if eq $role "all" }}
      - name: data
        mountPath: {{ dir $root.Values.database.sqlite.path }}
      {{- end }}
volumes:
  {{- include "fleetwatch.serverVolumes" $root | nindent 2 }}
  {{- if eq $role "all" }}
  - name: data
    {{- if $root.Values.database.sqlite.persistence.enabled }}
    persistentVolumeClaim:
      claimName: {{ include "fleetwatch.fullname" $root }}-data
    {{- else }}
    emptyDir: {}
    {{- end }}
  {{- end }}
{{- end }}
