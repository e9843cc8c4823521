{{/*
How the chart stays one with webhook-config/: every object's body is read from the kustomize base's
and components' own files (files/ links to them) and changed only where a value chooses what a
kustomize component or overlay would. tests/test_chart.py renders both and compares them.
*/}}

{{/* The objects of one (multi-document) YAML file, as a JSON list. */}}
{{- define "kratos.docs" -}}
{{- $out := list -}}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" . -1 -}}
{{- $o := fromYaml $doc -}}
{{- if and $o (hasKey $o "kind") -}}{{- $out = append $out $o -}}{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The labels every object gets: the base's part-of, and Helm's own. */}}
{{- define "kratos.labels" -}}
app.kubernetes.io/part-of: kratos-admit
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* One object, as kustomize's namespace and label transformers would write it: the release
namespace wherever the base says kratos-system (metadata, RoleBinding subjects, the webhooks'
Service, their namespaceSelector, cert-manager's names), namespaced kinds put in it, labels added.
Arguments: (dict "root" $ "obj" OBJECT). */}}
{{- define "kratos.emit" -}}
{{- $root := .root -}}
{{- $o := fromYaml (toYaml .obj | replace "kratos-system" $root.Release.Namespace) -}}
{{- $cluster := list "Namespace" "CustomResourceDefinition" "ClusterRole" "ClusterRoleBinding" "PriorityClass" "MutatingWebhookConfiguration" "ValidatingWebhookConfiguration" "AdmissionCheck" -}}
{{- if and (not (has $o.kind $cluster)) (not $o.metadata.namespace) -}}
{{- $_ := set $o.metadata "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- $_ := set $o.metadata "labels" (merge (include "kratos.labels" $root | fromYaml) ($o.metadata.labels | default dict)) }}
---
{{ toYaml $o }}
{{ end -}}

{{/* The environment a value adds to a Deployment's container, as the components' patches add it. */}}
{{- define "kratos.env" -}}
{{- $root := .root -}}
{{- $env := list -}}
{{- if eq $root.Values.scheduler "kai" -}}
{{- $env = append $env (dict "name" "KRATOS_SCHEDULER" "value" "kai") -}}
{{- $env = append $env (dict "name" "KRATOS_KAI_QUEUE" "value" $root.Values.kaiQueue) -}}
{{- else if eq $root.Values.scheduler "volcano" -}}
{{- $env = append $env (dict "name" "KRATOS_SCHEDULER" "value" "volcano") -}}
{{- else if eq $root.Values.scheduler "affinity" -}}
{{- $env = append $env (dict "name" "KRATOS_SCHEDULER_NAME" "value" "kratos-scheduler") -}}
{{- end -}}
{{- if and (eq .deployment "kratos-controller") $root.Values.kueue.admissionCheck.enabled -}}
{{- $env = append $env (dict "name" "KRATOS_KUEUE_ADMISSION_CHECK" "value" "true") -}}
{{- end -}}
{{- /* both: the controller asks Prometheus, the webhook only tells a gang's admission that telemetry is set */ -}}
{{- if $root.Values.telemetry.enabled -}}
{{- $env = append $env (dict "name" "KRATOS_TELEMETRY" "value" (printf "{prometheusURL: '%s'}" $root.Values.telemetry.prometheusURL)) -}}
{{- end -}}
{{- toJson $env -}}
{{- end -}}

{{/* The webhook/controller image. */}}
{{- define "kratos.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}
