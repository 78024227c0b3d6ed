{{/* Names, labels and small derived values shared by every template. */}}

{{- define "m3fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* At most 55 characters: the Services append "-webhook" and "-metrics", and a Service name is at most 63. */}}
{{- define "m3fleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The Secret with the webhook's serving certificate. cert-manager's has a name of its own: a Secret it wrote has
no Helm ownership, and Helm refuses to take over an object of that name when the chart makes the certificate again. */}}
{{- define "m3fleet.webhookSecret" -}}
{{- include "m3fleet.fullname" . }}-webhook-{{ if .Values.webhook.certManager.enabled }}cert-manager{{ else }}tls{{ end }}
{{- end -}}

{{- define "m3fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "m3fleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "m3fleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "m3fleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: m3fleet
{{- end -}}

{{- define "m3fleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "m3fleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The one namespace the operator watches with scope=namespace. */}}
{{- define "m3fleet.watchNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace -}}
{{- end -}}

{{- define "m3fleet.clusterScope" -}}
{{- if eq .Values.scope "cluster" -}}true{{- end -}}
{{- end -}}

{{- define "m3fleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The kopf peering object's name: fixed by `m3fleet run` (controller/run.py, peering_name). */}}
{{- define "m3fleet.peeringName" -}}m3fleet{{- end -}}

{{/*
A Prometheus duration (the schema's pattern: 1m30s, 500ms, ...) in milliseconds.
*/}}
{{- define "m3fleet.durationMs" -}}
{{- $total := 0 -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- $number := regexFind "^[0-9]+" . -}}
{{- $total = add $total (mul (atoi $number) (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
Cross-field rules the JSON schema cannot phrase clearly; each message names the value and the fix.
*/}}
{{- define "m3fleet.validate" -}}
{{- $replicas := int .Values.replicas -}}
{{- if and (gt $replicas 1) (not .Values.peering.enabled) -}}
{{- fail (printf "replicas: %d needs peering.enabled=true (without peering every replica reconciles at once); set peering.enabled=true for standby replicas, or replicas=1" $replicas) -}}
{{- end -}}
{{- if and (gt (int .Values.peering.priority) 0) (not .Values.peering.enabled) -}}
{{- fail "peering.priority is only used with peering.enabled=true; set peering.enabled=true or leave peering.priority 0" -}}
{{- end -}}
{{- if and (gt (int .Values.peering.priority) 0) (gt $replicas 1) -}}
{{- fail (printf "peering.priority: %d would be shared by all %d replicas, and peers with equal priority pause each other; leave peering.priority 0 (a random priority per pod) with replicas > 1" (int .Values.peering.priority) $replicas) -}}
{{- end -}}
{{- if and .Values.watchNamespace (eq .Values.scope "cluster") -}}
{{- fail (printf "watchNamespace: %q is only used with scope=namespace; set scope=namespace to watch only that namespace, or leave watchNamespace empty to watch every namespace" .Values.watchNamespace) -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled=true: the ServiceMonitor scrapes that Service" -}}
{{- end -}}
{{- range $key := list "app.kubernetes.io/name" "app.kubernetes.io/instance" -}}
{{- if hasKey $.Values.podLabels $key -}}
{{- fail (printf "podLabels: %s is the Deployment's selector label, set by the chart; remove it from podLabels (nameOverride changes the name)" $key) -}}
{{- end -}}
{{- end -}}
{{- if has (int .Values.webhook.port) (list 8080 9090) -}}
{{- fail (printf "webhook.port: %d is taken by the operator's liveness (8080) or metrics (9090) endpoint in the same container; pick another, e.g. 9443" (int .Values.webhook.port)) -}}
{{- end -}}
{{- $fullname := include "m3fleet.fullname" . -}}
{{- if regexMatch "^[0-9]" $fullname -}}
{{- fail (printf "the release name (or fullnameOverride) gives the objects the name %q, which starts with a digit, but the chart's Services are named after it and a Service name must start with a letter; install under a name that starts with a letter, or set fullnameOverride" $fullname) -}}
{{- end -}}
{{- range $monitor := list "serviceMonitor" "podMonitor" -}}
{{- $values := get $.Values.metrics $monitor -}}
{{- if and $values.enabled (gt (atoi (include "m3fleet.durationMs" $values.scrapeTimeout)) (atoi (include "m3fleet.durationMs" $values.interval))) -}}
{{- fail (printf "metrics.%s.scrapeTimeout: %s is longer than its interval %s, and Prometheus refuses such a scrape; set a timeout no longer than the interval" $monitor $values.scrapeTimeout $values.interval) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.rbac.secretNamespaces (ne .Values.scope "cluster") -}}
{{- fail (printf "rbac.secretNamespaces: %v is only used with scope=cluster; with scope=namespace the Role in the watched namespace grants Secrets there; leave rbac.secretNamespaces empty" .Values.rbac.secretNamespaces) -}}
{{- end -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "serviceAccount.create=false needs serviceAccount.name: the existing ServiceAccount the operator runs as" -}}
{{- end -}}
{{- end -}}

{{/*
The operator's RBAC rules for one kind of role, from files/rbac.yaml (generated from
m3fleet.controller.kube.RBAC by hack/generate.py). Pass (dict "ctx" $ "only" "all"|"namespaced"|"cluster"|"perNamespace"):
the rules for resources of that scope ("perNamespace": only the rules granted one namespace at a time).
Each entry's `when` says in which configuration the operator makes that call:
  always            every configuration
  perNamespace      only in a Role: the watched namespace (scope=namespace), or each of rbac.secretNamespaces
  scanning          rbac.scanning (kopf watches CRDs)
  namespaceScanning rbac.scanning and scope=namespace (kopf lists namespaces only when not cluster-wide)
  clusterPeering    peering.enabled and scope=cluster (ClusterKopfPeering)
  namespacedPeering peering.enabled and scope=namespace (KopfPeering)
  peering           peering.enabled (the write Lease)
*/}}
{{- define "m3fleet.rbacRules" -}}
{{- $ctx := .ctx -}}
{{- $cluster := eq $ctx.Values.scope "cluster" -}}
{{- $peering := $ctx.Values.peering.enabled -}}
{{- $scanning := $ctx.Values.rbac.scanning -}}
{{- $wanted := dict "always" true "perNamespace" (not $cluster) "scanning" $scanning "namespaceScanning" (and $scanning (not $cluster)) "clusterPeering" (and $peering $cluster) "namespacedPeering" (and $peering (not $cluster)) "peering" $peering -}}
{{- range (($ctx.Files.Get "files/rbac.yaml") | fromYaml).rules -}}
{{- $scope := ternary "cluster" "namespaced" .clusterScoped -}}
{{- $take := and (get $wanted .when) (or (eq $.only "all") (eq $.only $scope)) -}}
{{- if eq $.only "perNamespace" -}}
{{- $take = eq .when "perNamespace" -}}
{{- end -}}
{{- if $take }}
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{ .resource | quote }}]
  verbs: [{{ range $i, $v := .verbs }}{{ if $i }}, {{ end }}{{ $v | quote }}{{ end }}]
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The operator's user name at the apiserver: what the ValidatingAdmissionPolicies match on. */}}
{{- define "m3fleet.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "m3fleet.serviceAccountName" . }}
{{- end -}}
