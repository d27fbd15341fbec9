{{- define "protobot.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "protobot.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "protobot.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "protobot.serviceAccountName" -}}
{{- default (include "protobot.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- /*
The egress proxy's Service URL, as the operator and the conformance Job are given it (each
resolves the name to the Service's cluster IP at start-up; sandbox pods have no DNS).
*/}}
{{- define "protobot.egressProxyUrl" -}}
http://{{ printf "%s-egress-proxy" (include "protobot.fullname" .) | trunc 63 | trimSuffix "-" }}.{{ .Release.Namespace }}.svc:{{ .Values.egressProxy.port }}
{{- end -}}

{{- /*
The egress proxies' admin listener as the operator reads runs' model usage from it: a headless
Service, whose name resolves to every ready proxy pod (a run's calls may have gone through any
of them; the operator asks each and sums their shares).
*/}}
{{- define "protobot.egressProxyAdminName" -}}
{{ printf "%s-egress-proxy-admin" (include "protobot.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "protobot.egressProxyAdminUrl" -}}
http://{{ include "protobot.egressProxyAdminName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.egressProxy.adminPort }}
{{- end -}}

{{- /*
The pod of the sandbox conformance Job and CronJob (templates/conformance.yaml): the operator's
image running `protobot sandbox conformance` with the Job Site's profile, staging claim and
sandbox namespace. Arguments: root (the chart context), name, sandboxNamespace.
*/}}
{{- define "protobot.conformancePod" -}}
{{- $root := .root -}}
{{- $values := $root.Values -}}
{{- $image := $values.jobSite.conformance.image | default $values.jobSite.sandboxImage -}}
metadata:
  labels:
    {{- include "protobot.selectorLabels" $root | nindent 4 }}
    app.kubernetes.io/component: sandbox-conformance
spec:
  serviceAccountName: {{ .name }}
  restartPolicy: Never
  {{- with $values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    # The operator's uid: the probe pods (the profile's uid) share the staging files with it.
    runAsUser: 65532
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: conformance
      image: "{{ $values.image.repository }}:{{ $values.image.tag | default $root.Chart.AppVersion }}"
      imagePullPolicy: {{ $values.image.pullPolicy }}
      args:
        - sandbox
        - conformance
        - --profile={{ $values.jobSite.sandboxProfile }}
        - --profile-file=/etc/protobot/sandbox-profiles/{{ $values.jobSite.sandboxProfile }}.yaml
        - --sandbox-namespace={{ .sandboxNamespace }}
        - --staging-claim={{ $values.jobSite.staging.claimName }}
        - --staging-path=/var/lib/protobot/staging
        - --workdir=/var/lib/protobot/work
        {{- with $image }}
        - --sandbox-image={{ . }}
        {{- end }}
        # A failing report is stored and shown on every Project's SandboxConformant
        # condition; it does not fail the release.
        - --succeed-when-stored
        {{- if $values.egressProxy.enabled }}
        # The credential-broker probes run as pods through the egress proxy (it serves them
        # with egressProxy.conformanceProbe), with session tokens signed as the operator's.
        - --egress-proxy-url={{ include "protobot.egressProxyUrl" $root }}
        - --egress-session-secret=/etc/protobot/egress/session-secret/secret
        {{- end }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      resources:
        {{- toYaml $values.jobSite.conformance.resources | nindent 8 }}
      volumeMounts:
        - name: work
          mountPath: /var/lib/protobot/work
        - name: staging
          mountPath: /var/lib/protobot/staging
        - name: sandbox-profiles
          mountPath: /etc/protobot/sandbox-profiles
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- if $values.egressProxy.enabled }}
        - name: egress-session-secret
          mountPath: /etc/protobot/egress/session-secret
          readOnly: true
        {{- end }}
  volumes:
    - name: work
      emptyDir: {}
    - name: tmp
      emptyDir: {}
    - name: staging
      persistentVolumeClaim:
        claimName: {{ $values.jobSite.staging.claimName }}
    - name: sandbox-profiles
      configMap:
        name: {{ include "protobot.fullname" $root }}-sandbox-profiles
    {{- if $values.egressProxy.enabled }}
    - name: egress-session-secret
      secret:
        secretName: {{ required "egressProxy.sessionSecret must name a Secret whose key `secret` holds at least 32 random bytes (docs/egress-proxy.md)" $values.egressProxy.sessionSecret }}
        defaultMode: 0440
        items:
          - key: secret
            path: secret
    {{- end }}
{{- end -}}
