package deploy

import (
	"reflect"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestHelmStringSchedulingValues: nodeSelector, tolerations, affinity and
// priorityClassName written as the consul chart takes them (strings of
// YAML, templated) give the same pod spec as the same values as maps and
// lists.
func TestHelmStringSchedulingValues(t *testing.T) {
	needStack(t)
	asMaps := profile(t, "minimal")
	asMaps.values += `
priorityClassName: fs-critical
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: fs, effect: NoSchedule}]
affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app.kubernetes.io/instance: fs}}}}]}}
`
	asStrings := profile(t, "minimal")
	asStrings.values += `
priorityClassName: "{{ .Release.Name }}-critical"
nodeSelector: |
  kubernetes.io/os: linux
tolerations: |
  - key: dedicated
    operator: Equal
    value: {{ .Release.Name }}
    effect: NoSchedule
affinity: |
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              app.kubernetes.io/instance: {{ .Release.Name }}
`
	var a, b appsv1.Deployment
	asMaps.render(t, "fs", "fleetsync").one(t, "Deployment", &a)
	asStrings.render(t, "fs", "fleetsync").one(t, "Deployment", &b)
	pa, pb := a.Spec.Template.Spec, b.Spec.Template.Spec
	if pa.Affinity == nil || len(pa.Tolerations) != 1 || pa.NodeSelector["kubernetes.io/os"] != "linux" || pa.PriorityClassName != "fs-critical" {
		t.Fatalf("maps: %+v", pa)
	}
	if !reflect.DeepEqual(pa.NodeSelector, pb.NodeSelector) || !reflect.DeepEqual(pa.Tolerations, pb.Tolerations) ||
		!reflect.DeepEqual(pa.Affinity, pb.Affinity) || pa.PriorityClassName != pb.PriorityClassName {
		t.Errorf("strings give another pod spec:\n%+v\nwant\n%+v", pb, pa)
	}
}
