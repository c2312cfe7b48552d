{{/*
Object names are fixed (node-health-agent, node-health-agent-<accelerator>): the kustomize tree under
daemonset/ renders the same objects (tests/test_helm.py compares them), and alerts and dashboards
find the agents by these names.
*/}}
{{- define "nha.name" -}}node-health-agent{{- end }}

{{- define "nha.labels" -}}
app.kubernetes.io/name: node-health-agent
app.kubernetes.io/part-of: node-health-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
The image reference. No image is published for this chart's version yet: image.repository has no
default, so an install cannot silently pull an image that does not exist (docs/deploy.md, "1. The image").
*/}}
{{- define "nha.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if not $repo -}}
{{- fail "image.repository is empty: build and push the image first (docs/deploy.md, section 1: docker build -t <registry>/node-health-agent:<version> . && docker push ...), then set image.repository=<registry>/node-health-agent (and image.tag or image.digest)" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{ $repo }}@{{ .Values.image.digest }}
{{- else -}}
{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* The accelerators in the order their node selectors take precedence, then the generic agent. */}}
{{- define "nha.order" -}}neuron,nvidia,generic{{- end }}

{{/* The enabled agents, comma-separated, in order. */}}
{{- define "nha.enabled" -}}
{{- $out := list }}
{{- range $name := splitList "," (include "nha.order" .) }}
{{- if (index $.Values.accelerators $name).enabled }}{{ $out = append $out $name }}{{ end }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/*
nodeSelectorTerms of one agent ({"root": $, "name": <accelerator>}): one term per matchNodes entry
(terms are ORed), each with kubernetes.io/os=linux and the negation of every matchNodes entry of the
accelerators before it in nha.order that are enabled; generic is one term with all those negations.
*/}}
{{- define "nha.nodeSelectorTerms" -}}
{{- $root := .root }}
{{- $negate := dict "In" "NotIn" "NotIn" "In" "Exists" "DoesNotExist" "DoesNotExist" "Exists" }}
{{- $exclude := list }}
{{- range $other := splitList "," (include "nha.order" $root) }}
{{- if eq $other $.name }}{{ break }}{{ end }}
{{- $acc := index $root.Values.accelerators $other }}
{{- if and $acc.enabled (ne $other "generic") }}
{{- range $e := $acc.matchNodes }}
{{- $n := dict "key" $e.key "operator" (index $negate $e.operator) }}
{{- if $e.values }}{{ $_ := set $n "values" $e.values }}{{ end }}
{{- $exclude = append $exclude $n }}
{{- end }}
{{- end }}
{{- end }}
{{- $os := dict "key" "kubernetes.io/os" "operator" "In" "values" (list "linux") }}
{{- $terms := list }}
{{- if eq .name "generic" }}
{{- $terms = append $terms (dict "matchExpressions" (concat (list $os) $exclude)) }}
{{- else }}
{{- range $e := (index $root.Values.accelerators .name).matchNodes }}
{{- $terms = append $terms (dict "matchExpressions" (concat (list $os $e) $exclude)) }}
{{- end }}
{{- end }}
{{- toYaml $terms }}
{{- end }}

{{/* The extra --config files of every agent, sorted by name. */}}
{{- define "nha.configFiles" -}}
{{- $files := list "rules.yaml" "checks.yaml" }}
{{- range $name := keys .Values.extraConfigFiles | sortAlpha }}{{ $files = append $files $name }}{{ end }}
{{- join "," $files }}
{{- end }}


{{/* The data of one agent's ConfigMap ({"root": $, "name": <accelerator>}); its checksum rolls that agent's pods. */}}
{{- define "nha.configData" -}}
{{- $ := .root }}
{{- $acc := index $.Values.accelerators .name -}}
rules.yaml: |
  {{- if $acc.rules }}
  {{- toYaml $acc.rules | nindent 2 }}
  {{- else }}
  {{- $.Files.Get (printf "files/variants/%s/rules.yaml" .name) | nindent 2 }}
  {{- end }}
checks.yaml: |
  {{- if $acc.checks }}
  {{- toYaml $acc.checks | nindent 2 }}
  {{- else }}
  {{- $.Files.Get (printf "files/variants/%s/checks.yaml" .name) | nindent 2 }}
  {{- end }}
{{- if $.Values.recovery.policy }}
recovery-policy.yaml: |
  {{- toYaml $.Values.recovery.policy | nindent 2 }}
{{- end }}
{{- range $file := keys $.Values.extraConfigFiles | sortAlpha }}
{{ $file }}: |
  {{- $doc := index $.Values.extraConfigFiles $file }}
  {{- if kindIs "string" $doc }}{{ $doc | nindent 2 }}{{ else }}{{ toYaml $doc | nindent 2 }}{{ end }}
{{- end }}
{{- end }}

{{/*
Where the agents mount the chart's exec plugins (the kustomize component's path), and the data of their
ConfigMap: the declarations and the scripts, sorted by name. Empty when no declaration is given.
*/}}
{{- define "nha.execPluginsDir" -}}/etc/node-health-agent/exec-plugins{{- end }}

{{- define "nha.execPluginsData" -}}
{{- $ep := .Values.execPlugins | default dict }}
{{- $scripts := $ep.scripts | default dict }}
{{- $monitors := $ep.monitors | default dict }}
{{- if and $scripts (not $monitors) }}
{{- fail (printf "execPlugins.scripts (%s) without execPlugins.monitors: a script runs only when a custom-plugin-monitor declaration names it (docs/checks-exec.md, \"Shipping a check with Helm\")" (keys $scripts | sortAlpha | join ", ")) }}
{{- end }}
{{- range $file := keys $monitors | sortAlpha }}
{{- if hasKey $scripts $file }}{{ fail (printf "execPlugins: %s is both a script and a monitor" $file) }}{{ end }}
{{ $file }}: |
  {{- $doc := index $monitors $file }}
  {{- if kindIs "string" $doc }}{{ $doc | nindent 2 }}
  {{- else if hasSuffix ".json" $file }}{{ toPrettyJson $doc | nindent 2 }}
  {{- else }}{{ toYaml $doc | nindent 2 }}{{ end }}
{{- end }}
{{- range $file := keys $scripts | sortAlpha }}
{{ $file }}: |
  {{- index $scripts $file | nindent 2 }}
{{- end }}
{{- end }}

{{/*
One release per cluster: the objects' names do not depend on the release name, so a second release
would share the ClusterRoles and put a second agent on every node. On a real install or upgrade
(`lookup` reads the cluster; under `helm template` and a client dry run it finds nothing) the release
refuses when the ClusterRole node-health-agent belongs to another release. The check itself takes the
found object ({"root": $, "existing": <object or empty>}), so tests can hand it one.
*/}}
{{- define "nha.onePerCluster" -}}
{{- $root := .root }}
{{- $annotations := dig "metadata" "annotations" dict (.existing | default dict) }}
{{- $owner := index $annotations "meta.helm.sh/release-name" | default "" }}
{{- $ownerNs := index $annotations "meta.helm.sh/release-namespace" | default "" }}
{{- if and $owner (or (ne $owner $root.Release.Name) (ne $ownerNs $root.Release.Namespace)) }}
{{- fail (printf "node-health-agent is already installed in this cluster by Helm release %q in namespace %q (it owns ClusterRole node-health-agent): install the chart once per cluster. Change that release instead (helm upgrade %s ... --namespace %s), or uninstall it first (helm uninstall %s --namespace %s); two releases would put two agents on every node." $owner $ownerNs $owner $ownerNs $owner $ownerNs) }}
{{- end }}
{{- end }}
