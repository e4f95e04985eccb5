package tok8s

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/consul/watch"
)

// TestMirrorKinds: each --to-k8s-mode's Service, and SameService telling
// the kinds apart (a kind change is never "the same").
func TestMirrorKinds(t *testing.T) {
	u := Unit{Namespace: "m", Name: "web", ConsulName: "web", Mirror: true, PortName: PortName}
	eps, _ := testConfig(t).Endpoints([]watch.Entry{vm("a", "10.0.0.1", 8080, "passing")})
	tests := []struct {
		kind, domain  string
		typ           corev1.ServiceType
		clusterIP     string
		externalName  string
		ports, slices bool
	}{
		{"", "", corev1.ServiceTypeClusterIP, "", "", true, true},
		{KindEndpointSlices, "", corev1.ServiceTypeClusterIP, "", "", true, true},
		{KindHeadless, "", corev1.ServiceTypeClusterIP, corev1.ClusterIPNone, "", true, true},
		{KindExternalName, "", corev1.ServiceTypeExternalName, "", "web.service.consul", false, false},
		{KindExternalName, "dc1.example", corev1.ServiceTypeExternalName, "", "web.service.dc1.example", false, false},
	}
	built := map[string]*corev1.Service{}
	for _, tt := range tests {
		c := testConfig(t)
		c.Kind, c.Domain = tt.kind, tt.domain
		svc := c.DesiredService(u, eps)
		s := svc.Spec
		if s.Type != tt.typ || s.ClusterIP != tt.clusterIP || s.ExternalName != tt.externalName || (len(s.Ports) == 1) != tt.ports ||
			c.HasSlices() != tt.slices || s.Selector != nil || c.Mark.Owns(svc) != nil {
			t.Errorf("kind %q: spec %+v, slices %v, labels %v", tt.kind, s, c.HasSlices(), svc.Labels)
		}
		if tt.kind == KindExternalName && svc.Annotations[AnnotationConsulK8sSync] != "false" {
			t.Errorf("externalname: annotations %v, want %s=false as consul-k8s sets it", svc.Annotations, AnnotationConsulK8sSync)
		}
		if KindOf(svc) != c.kind() {
			t.Errorf("KindOf(%q's Service) = %s", tt.kind, KindOf(svc))
		}
		built[c.kind()+tt.domain] = svc
	}
	for a, x := range built {
		for b, y := range built {
			if got := SameService(x, y); got != (a == b) {
				t.Errorf("SameService(%s, %s) = %v", a, b, got)
			}
		}
	}
}

// TestAdoptConsulK8s: exactly consul-k8s's object of the name is adopted
// (its label consul=true goes, the mark and fleetsync's annotations come,
// others' labels and the spec stay); anything else is refused.
func TestAdoptConsulK8s(t *testing.T) {
	c := testConfig(t)
	c.Kind = KindExternalName
	u := Unit{Namespace: "m", Name: "web", ConsulName: "web", Mirror: true, PortName: PortName}
	eps, _ := c.Endpoints([]watch.Entry{vm("a", "10.0.0.1", 8080, "passing")})
	want := c.DesiredService(u, eps)
	consulK8s := func() *corev1.Service { // as consul-k8s's sink makes it
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "m", Name: "web",
			Labels:      map[string]string{"consul": "true", "team": "x"},
			Annotations: map[string]string{AnnotationConsulK8sSync: "false"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "web.service.consul"}}
	}
	got, err := c.adoptConsulK8s(u, want)(consulK8s())
	if err != nil || c.Mark.Owns(got) != nil || got.Labels["consul"] != "" || got.Labels["team"] != "x" ||
		got.Annotations[AnnotationConsulService] != "web" || !SameService(want, got) {
		t.Fatalf("adopted: %v, labels %v, annotations %v, spec %+v", err, got.Labels, got.Annotations, got.Spec)
	}
	for name, edit := range map[string]func(*corev1.Service){
		"no consul label":    func(s *corev1.Service) { delete(s.Labels, "consul") },
		"another name":       func(s *corev1.Service) { s.Spec.ExternalName = "db.service.consul" },
		"another domain":     func(s *corev1.Service) { s.Spec.ExternalName = "web.service.other" },
		"a ClusterIP":        func(s *corev1.Service) { s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP} },
		"consul label=false": func(s *corev1.Service) { s.Labels["consul"] = "false" },
	} {
		s := consulK8s()
		edit(s)
		if _, err := c.adoptConsulK8s(u, want)(s); !errors.Is(err, errNotConsulK8s) {
			t.Errorf("%s: err %v, want a refusal", name, err)
		}
	}
}
