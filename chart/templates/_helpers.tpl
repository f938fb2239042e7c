{{/*
Names, labels and images.
*/}}
{{- define "haptic.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "haptic.fullname" -}}
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

{{/* Common labels; call with (dict "root" $ "component" "controller"). */}}
{{- define "haptic.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "haptic.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: haptic
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "haptic.selectorLabels" -}}
app.kubernetes.io/name: {{ include "haptic.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/* Image reference; call with (dict "root" $ "image" .Values.controller.image). */}}
{{- define "haptic.image" -}}
{{- $registry := default .image.registry .root.Values.global.imageRegistry -}}
{{- $tag := default .root.Chart.AppVersion .image.tag | toString -}}
{{- $ref := printf "%s:%s" .image.repository $tag -}}
{{- if $registry -}}{{- $ref = printf "%s/%s" $registry $ref -}}{{- end -}}
{{- if .image.digest -}}{{- $ref = printf "%s@%s" $ref .image.digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{- define "haptic.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "haptic.controllerServiceAccount" -}}
{{- default (printf "%s-controller" (include "haptic.fullname" .)) .Values.controller.serviceAccount.name -}}
{{- end -}}

{{- define "haptic.haproxyServiceAccount" -}}
{{- default (printf "%s-haproxy" (include "haptic.fullname" .)) .Values.haproxy.serviceAccount.name -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: one release per namespace may share a name. */}}
{{- define "haptic.clusterName" -}}
{{- printf "%s-%s" (include "haptic.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "haptic.configName" -}}{{ include "haptic.fullname" . }}{{- end -}}
{{- define "haptic.webhookService" -}}{{ include "haptic.fullname" . }}-controller{{- end -}}
{{- define "haptic.agentServerSecret" -}}{{ include "haptic.fullname" . }}-agent-server-tls{{- end -}}
{{- define "haptic.agentClientSecret" -}}{{ include "haptic.fullname" . }}-agent-client-tls{{- end -}}
{{- define "haptic.webhookSecret" -}}{{ include "haptic.fullname" . }}-webhook-tls{{- end -}}
{{- define "haptic.credentialsSecret" -}}{{ include "haptic.fullname" . }}-credentials{{- end -}}
{{- define "haptic.defaultCertNamespace" -}}{{ default .Release.Namespace .Values.defaultSSLCertificate.namespace }}{{- end -}}

{{/* Container security context shared by every container: non-root, read-only, nothing added. */}}
{{- define "haptic.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "haptic.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Template libraries.
*/}}

{{/* Library value keys and files, in merge order. */}}
{{- define "haptic.libraryOrder" -}}
[["base","base.yaml"],["ssl","ssl.yaml"],["ingress","ingress.yaml"],["gateway","gateway.yaml"],["haproxytech","haproxytech.yaml"],["haproxyIngress","haproxy-ingress.yaml"]]
{{- end -}}

{{/* "true" when the gateway library is in use. */}}
{{- define "haptic.gatewayEnabled" -}}
{{- $e := .Values.libraries.gateway.enabled -}}
{{- if or (eq (toString $e) "true") (and (eq (toString $e) "auto") (.Capabilities.APIVersions.Has "gateway.networking.k8s.io/v1/GatewayClass")) -}}true{{- end -}}
{{- end -}}

{{/* JSON list of the library files to merge: enabled and present in the chart. */}}
{{- define "haptic.enabledLibraries" -}}
{{- $out := list -}}
{{- range (include "haptic.libraryOrder" . | fromJsonArray) -}}
{{- $key := index . 0 -}}
{{- $file := printf "libraries/%s" (index . 1) -}}
{{- $lib := get $.Values.libraries $key -}}
{{- $on := and $lib (eq (toString $lib.enabled) "true") -}}
{{- if eq $key "gateway" -}}{{- $on = eq (include "haptic.gatewayEnabled" $) "true" -}}{{- end -}}
{{- if and $on ($.Files.Get $file) -}}{{- $out = append $out $file -}}{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The merge of `haptic config merge` (src/config/mod.rs merge_values): mappings by key, later
wins recursively, a null removes the key, lists and scalars replaced. Call with
(dict "base" MAP "overlay" MAP); returns JSON.
*/}}
{{- define "haptic.deepMerge" -}}
{{- $out := deepCopy .base -}}
{{- range $k, $v := .overlay -}}
{{- if kindIs "invalid" $v -}}
{{- $_ := unset $out $k -}}
{{- else if and (kindIs "map" $v) (hasKey $out $k) (kindIs "map" (get $out $k)) -}}
{{- $_ := set $out $k (include "haptic.deepMerge" (dict "base" (get $out $k) "overlay" $v) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The spec fragments of one library file (full manifests give their spec); JSON list. */}}
{{- define "haptic.libraryFragments" -}}
{{- $out := list -}}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" (.root.Files.Get .file) -1 -}}
{{- $v := fromYaml $doc -}}
{{- if hasKey $v "Error" -}}{{- fail (printf "chart %s: %s" $.file (get $v "Error")) -}}{{- end -}}
{{- if $v -}}
{{- if or (hasKey $v "kind") (hasKey $v "apiVersion") -}}{{- $v = default dict $v.spec -}}{{- end -}}
{{- $out = append $out $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* What the chart itself sets in the spec (merged after the libraries, before controller.config). */}}
{{- define "haptic.chartSpec" -}}
credentialsSecretRef:
  name: {{ include "haptic.credentialsSecret" . }}
podSelector:
  matchLabels:
    {{- include "haptic.selectorLabels" (dict "root" . "component" "haproxy") | nindent 4 }}
controller:
  leaderElection:
    enabled: {{ .Values.controller.leaderElection.enabled }}
    leaseName: {{ include "haptic.fullname" . }}-leader
    leaseDuration: {{ .Values.controller.leaderElection.leaseDuration | quote }}
    renewDeadline: {{ .Values.controller.leaderElection.renewDeadline | quote }}
    retryPeriod: {{ .Values.controller.leaderElection.retryPeriod | quote }}
dataplane:
  port: {{ .Values.agent.port }}
  configFile: /etc/haproxy/haproxy.cfg
  mapsDir: /etc/haproxy/maps
  sslCertsDir: /etc/haproxy/ssl
  generalStorageDir: /etc/haproxy/general
templatingSettings:
  extraContext:
    http_port: {{ .Values.haproxy.ports.http }}
    https_port: {{ .Values.haproxy.ports.https }}
    status_port: {{ .Values.haproxy.ports.status }}
    {{- /* The ports clients use: the Service's, or the pods' own when they hold their nodes' ports */}}
    public_http_port: {{ ternary .Values.haproxy.ports.http .Values.haproxy.service.port.http (or .Values.haproxy.hostNetwork .Values.haproxy.hostPorts) | int }}
    public_https_port: {{ ternary .Values.haproxy.ports.https .Values.haproxy.service.port.https (or .Values.haproxy.hostNetwork .Values.haproxy.hostPorts) | int }}
    status_stats: {{ .Values.haproxy.stats }}
    {{- /* Gateway listeners on other ports: exactly the ports the Service and pods expose;
        never the agent's or the controller's ports */}}
    gateway_listener_ports: {{ include "haptic.gatewayPorts" . }}
    gateway_reserved_ports: {{ toJson (list (int .Values.agent.port) (int .Values.agent.probePort) (int .Values.controller.ports.health) (int .Values.controller.ports.metrics) (int .Values.controller.ports.webhook)) }}
    hard_stop_after_seconds: {{ .Values.haproxy.drain.hardStopAfterSeconds | int }}
    default_ssl_cert_namespace: {{ include "haptic.defaultCertNamespace" . | quote }}
    default_ssl_cert_name: {{ .Values.defaultSSLCertificate.name | quote }}
    ingress_class: {{ .Values.ingressClass.name | quote }}
    ingress_controller: {{ .Values.ingressClass.controllerName | quote }}
    gateway_class: {{ .Values.gatewayClass.name | quote }}
    gateway_controller: {{ .Values.gatewayClass.controllerName | quote }}
    haproxy_service_namespace: {{ .Release.Namespace | quote }}
    haproxy_service_name: {{ printf "%s-haproxy" (include "haptic.fullname" .) | quote }}
    status_node_addresses: {{ or .Values.haproxy.hostNetwork .Values.haproxy.hostPorts }}
    {{- if .Values.haproxy.ipv6 }}
    {{- /* Every frontend on [::]: both address families (IPv6-only and dual-stack clusters) */}}
    bind_address: "[::]"
    {{- end }}
# The libraries' own validation tests stay in the library files (scripts/test.sh runs them with
# haptic validate): the controller never runs them, they are most of the object's size, and a
# library's tests may use resources only another library watches, which would make a partial
# set of libraries an invalid config. Tests in controller.config are kept.
validationTests: null
{{- end -}}

{{/* The merged HAProxyTemplateConfig spec as JSON: libraries, chart settings, controller.config. */}}
{{- define "haptic.configSpec" -}}
{{- $spec := dict -}}
{{- range $file := include "haptic.enabledLibraries" . | fromJsonArray -}}
{{- range $frag := include "haptic.libraryFragments" (dict "root" $ "file" $file) | fromJsonArray -}}
{{- $spec = include "haptic.deepMerge" (dict "base" $spec "overlay" $frag) | fromJson -}}
{{- end -}}
{{- end -}}
{{- $spec = include "haptic.deepMerge" (dict "base" $spec "overlay" (include "haptic.chartSpec" . | fromYaml)) | fromJson -}}
{{- $spec = include "haptic.deepMerge" (dict "base" $spec "overlay" (default dict .Values.controller.config)) | fromJson -}}
{{- toJson $spec -}}
{{- end -}}

{{/*
RBAC derived from spec.watchedResources: JSON {"watch": {group: [resources]}, "status": {group: [resources]}}.
Status writes are granted for the kinds templates set status on (Ingress and the Gateway API kinds).
*/}}
{{- define "haptic.watchedRBAC" -}}
{{- $spec := include "haptic.configSpec" . | fromJson -}}
{{- $watch := dict -}}
{{- $status := dict -}}
{{- $statusKinds := list "networking.k8s.io/ingresses" "gateway.networking.k8s.io/gatewayclasses" "gateway.networking.k8s.io/gateways" "gateway.networking.k8s.io/httproutes" "gateway.networking.k8s.io/grpcroutes" "gateway.networking.k8s.io/tlsroutes" "gateway.networking.k8s.io/backendtlspolicies" "gateway.networking.k8s.io/tcproutes" "gateway.networking.k8s.io/udproutes" -}}
{{- range $name, $w := (default dict $spec.watchedResources) -}}
{{- if $w -}}
{{- $group := "" -}}
{{- if contains "/" $w.apiVersion -}}{{- $group = first (splitList "/" $w.apiVersion) -}}{{- end -}}
{{- $_ := set $watch $group (append (default list (get $watch $group)) $w.resources | uniq | sortAlpha) -}}
{{- if has (printf "%s/%s" $group $w.resources) $statusKinds -}}
{{- $_ := set $status $group (append (default list (get $status $group)) (printf "%s/status" $w.resources) | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "watch" $watch "status" $status) -}}
{{- end -}}

{{/* Watched kinds with enableValidationWebhook: JSON list of {group, version, resource}. */}}
{{- define "haptic.webhookRules" -}}
{{- $spec := include "haptic.configSpec" . | fromJson -}}
{{- $out := list -}}
{{- range $name, $w := (default dict $spec.watchedResources) -}}
{{- if and $w $w.enableValidationWebhook -}}
{{- $gv := splitList "/" $w.apiVersion -}}
{{- $group := "" -}}{{- $version := first $gv -}}
{{- if eq (len $gv) 2 -}}{{- $group = first $gv -}}{{- $version = last $gv -}}{{- end -}}
{{- $out = append $out (dict "group" $group "version" $version "resource" $w.resources) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Certificates (provider helm): generated once, kept across upgrades by looking up the existing
Secrets. Returns JSON {ca, agentServer{crt,key}, agentClient{crt,key}, webhook{crt,key}}, PEM text.
Cached in .Values so every template sees the same material within one render.
*/}}
{{- define "haptic.certs" -}}
{{- if not (hasKey .Values "__hapticCerts") -}}
{{- $ns := .Release.Namespace -}}
{{- $srv := lookup "v1" "Secret" $ns (include "haptic.agentServerSecret" .) -}}
{{- $cli := lookup "v1" "Secret" $ns (include "haptic.agentClientSecret" .) -}}
{{- $wh := lookup "v1" "Secret" $ns (include "haptic.webhookSecret" .) -}}
{{- $certs := dict -}}
{{- if and $srv $cli $wh $srv.data $cli.data $wh.data -}}
{{- $certs = dict "ca" (index $srv.data "ca.crt" | b64dec)
      "agentServer" (dict "crt" (index $srv.data "tls.crt" | b64dec) "key" (index $srv.data "tls.key" | b64dec))
      "agentClient" (dict "crt" (index $cli.data "tls.crt" | b64dec) "key" (index $cli.data "tls.key" | b64dec))
      "webhook" (dict "crt" (index $wh.data "tls.crt" | b64dec) "key" (index $wh.data "tls.key" | b64dec)) -}}
{{- else -}}
{{- $days := int .Values.certificates.validityDays -}}
{{- $ca := genCA (printf "%s-ca" (include "haptic.fullname" .)) $days -}}
{{- $svc := include "haptic.webhookService" . -}}
{{- $server := genSignedCert "haptic-agent" nil (list "haptic-agent") $days $ca -}}
{{- $client := genSignedCert "haptic-controller" nil (list "haptic-controller") $days $ca -}}
{{- $webhook := genSignedCert (printf "%s.%s.svc" $svc $ns) nil (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) $days $ca -}}
{{- $certs = dict "ca" $ca.Cert
      "agentServer" (dict "crt" $server.Cert "key" $server.Key)
      "agentClient" (dict "crt" $client.Cert "key" $client.Key)
      "webhook" (dict "crt" $webhook.Cert "key" $webhook.Key) -}}
{{- end -}}
{{- $_ := set .Values "__hapticCerts" (toJson $certs) -}}
{{- end -}}
{{- get .Values "__hapticCerts" -}}
{{- end -}}

{{/* True when any HAProxy port is below 1024. */}}
{{- define "haptic.privilegedPorts" -}}
{{- $low := or (lt (int .Values.haproxy.ports.http) 1024) (lt (int .Values.haproxy.ports.https) 1024) (lt (int .Values.haproxy.ports.status) 1024) -}}
{{- range .Values.haproxy.gatewayPorts }}{{- if lt (int .port) 1024 }}{{- $low = true }}{{- end }}{{- end -}}
{{- if $low -}}true{{- end -}}
{{- end -}}

{{/*
haproxy.gatewayPorts as a JSON list of port numbers (the libraries' gateway_listener_ports).
A port HAProxy or the agent already uses, or listed twice, stops the install.
*/}}
{{- define "haptic.gatewayPorts" -}}
{{- $h := .Values.haproxy -}}
{{- $taken := list (int $h.ports.http) (int $h.ports.https) (int $h.ports.status) (int .Values.agent.port) (int .Values.agent.probePort) -}}
{{- $ports := list -}}
{{- range $h.gatewayPorts -}}
{{- if or (has (int .port) $taken) (has (int .port) $ports) -}}
{{- fail (printf "haproxy.gatewayPorts: port %d is listed twice or is a port HAProxy or the agent already uses" (int .port)) -}}
{{- end -}}
{{- $ports = append $ports (int .port) -}}
{{- end -}}
{{- toJson $ports -}}
{{- end -}}
