{{/* Names, labels and values derived once for every template of the chart. */}}

{{- define "kwc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kwc.fullname" -}}
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

{{- define "kwc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kwc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kwc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kwc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kwc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kwc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kwc.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding tls.crt / tls.key (and ca.crt for certManager and selfSigned). */}}
{{- define "kwc.tlsSecretName" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}
{{- required "tls.existingSecret is required with tls.mode=existingSecret" .Values.tls.existingSecret -}}
{{- else -}}
{{- printf "%s-tls" (include "kwc.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The service's DNS names: the serving certificate's SANs. */}}
{{- define "kwc.dnsNames" -}}
{{- $full := include "kwc.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list $full (printf "%s.%s" $full $ns) (printf "%s.%s.svc" $full $ns) (printf "%s.%s.svc.%s" $full $ns .Values.clusterDomain) -}}
{{- concat $names .Values.tls.extraDNSNames | uniq | toJson -}}
{{- end -}}

{{/* The serving certificate's IP addresses: the Service's fixed ClusterIP, and the extra ones. */}}
{{- define "kwc.ipAddresses" -}}
{{- $ips := list -}}
{{- with .Values.service.clusterIP }}{{- $ips = append $ips . -}}{{- end -}}
{{- concat $ips .Values.tls.extraIPAddresses | uniq | toJson -}}
{{- end -}}

{{/* "true" when client certificates are on (clientCA.configMap or clientCA.secret set). */}}
{{- define "kwc.clientCAEnabled" -}}
{{- if and .Values.clientCA.configMap .Values.clientCA.secret -}}
{{- fail "clientCA: set configMap or secret, not both" -}}
{{- end -}}
{{- if or .Values.clientCA.configMap .Values.clientCA.secret -}}true{{- end -}}
{{- end -}}

{{/* Pod termination budget: shutdown delay + drain grace + 10 s, or the checked override. */}}
{{- define "kwc.terminationGracePeriodSeconds" -}}
{{- $need := add .Values.shutdown.delaySeconds .Values.shutdown.gracePeriodSeconds -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add $need 10 -}}
{{- else if le (int .Values.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be larger than shutdown.delaySeconds + shutdown.gracePeriodSeconds (%v)" .Values.terminationGracePeriodSeconds $need) -}}
{{- else -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* The ClusterRole rules for config.resources: list/watch, one rule per API group (the
     proxy's own reads are lists and watches; no `get`, which on `*` would also grant
     nodes/proxy and pods/exec). */}}
{{- define "kwc.resourceRules" -}}
{{- if has "*" .Values.config.resources }}
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["list", "watch"]
{{- else -}}
{{- $groups := list -}}
{{- $byGroup := dict -}}
{{- range .Values.config.resources -}}
{{- /* `group/resource`, `resource.group` (kubectl's form) or `resource`; `core` is "" */ -}}
{{- $parts := splitList "/" . -}}
{{- $group := "" -}}
{{- $resource := . -}}
{{- if eq (len $parts) 2 -}}
{{- $group = index $parts 0 -}}
{{- $resource = index $parts 1 -}}
{{- else if contains "." . -}}
{{- $dot := splitn "." 2 . -}}
{{- $resource = $dot._0 -}}
{{- $group = $dot._1 -}}
{{- end -}}
{{- if eq $group "core" -}}
{{- $group = "" -}}
{{- end -}}
{{- if not (hasKey $byGroup $group) -}}
{{- $groups = append $groups $group -}}
{{- $_ := set $byGroup $group (list) -}}
{{- end -}}
{{- $_ := set $byGroup $group (append (get $byGroup $group) $resource) -}}
{{- end -}}
{{- range $groups }}
- apiGroups: [{{ . | quote }}]
  resources: {{ get $byGroup . | toJson }}
  verbs: ["list", "watch"]
{{- end -}}
{{- end -}}
{{- if .Values.state.enabled }}
{{- /* Warm restarts name the cluster by the kube-system Namespace's uid (src/state):
       without this a named list without namespaces refuses every state file. */}}
- apiGroups: [""]
  resources: ["namespaces"]
  resourceNames: ["kube-system"]
  verbs: ["get"]
{{- end -}}
{{- end -}}

{{/*
kwc.selfSignedKeep: "true" when the self-signed Secret found in the cluster may be kept at an
upgrade: it has its three files, and either it predates these annotations (an older chart's,
kept as before) or it names the same addresses (kube-watchcache.io/sans, a digest of the SANs)
and stays valid for more than 30 days (kube-watchcache.io/not-after). Otherwise a new CA and
certificate are generated: before 2026-11-29 an expired certificate, or one without a
service.clusterIP set later, was kept at every upgrade. Args: dict "existing" (the Secret, or
an empty dict) "sans" (this render's digest) "now" (a time).
*/}}
{{- define "kwc.selfSignedKeep" -}}
{{- $s := .existing | default dict -}}
{{- $d := $s.data | default dict -}}
{{- $a := (($s.metadata | default dict).annotations) | default dict -}}
{{- if and (index $d "tls.crt") (index $d "tls.key") (index $d "ca.crt") -}}
{{- $notAfter := index $a "kube-watchcache.io/not-after" | default "" -}}
{{- $sans := index $a "kube-watchcache.io/sans" | default "" -}}
{{- if and (not $notAfter) (not $sans) -}}true
{{- else if and $notAfter (eq $sans .sans) -}}
{{- $left := sub (toDate "2006-01-02T15:04:05Z07:00" $notAfter | unixEpoch | atoi) (.now | unixEpoch | atoi) -}}
{{- if gt $left (mul 30 86400) -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
