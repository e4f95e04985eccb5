package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// consulK8sObject is the Service consul-k8s's catalog sync makes of a
// Consul service (control-plane/catalog/to-k8s/sink.go).
func consulK8sObject(ns, name, externalName string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels:      map[string]string{"consul": "true"},
		Annotations: map[string]string{"consul.hashicorp.com/service-sync": "false"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: externalName}}
}

// TestToK8sAdoptConsulK8s: with --to-k8s-adopt-consul-k8s, consul-k8s's
// ExternalName object of a mirrored name becomes fleetsync's in place (same
// UID; consul-k8s's label gone, the mark on), once; a consul=true Service
// pointing elsewhere and a plain Service of mirrored names are left alone
// with a NameTaken Event. Switched to endpointslices, the adopted Service is
// converted like any of fleetsync's own.
func TestToK8sAdoptConsulK8s(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "a"
	web, decoy, plain := p+"-web", p+"-decoy", p+"-plain"
	for i, n := range []string{web, decoy, plain} {
		vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.85.0.%d", i+1), n, n+"-1", "", 8080, "passing")
	}
	theirs := map[string]*corev1.Service{}
	for _, svc := range []*corev1.Service{
		consulK8sObject(e.ns, web, web+".service.consul"),
		consulK8sObject(e.ns, decoy, "elsewhere.service.consul"),
		{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: plain}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
	} {
		got, err := kube.Client.CoreV1().Services(e.ns).Create(e.ctx, svc, metav1.CreateOptions{})
		must(t, err)
		theirs[got.Name] = got
	}
	d := e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*", "--to-k8s-mode=externalname", "--to-k8s-adopt-consul-k8s")
	adopted := e.waitService(web, func(s *corev1.Service) error {
		if s.UID != theirs[web].UID || s.Labels["consul"] != "" || s.Spec.Type != corev1.ServiceTypeExternalName || s.Spec.ExternalName != web+".service.consul" {
			return fmt.Errorf("not adopted in place: uid %s (was %s), labels %v, spec %+v", s.UID, theirs[web].UID, s.Labels, s.Spec)
		}
		return nil
	})
	eventually(t, 10*time.Second, "NameTaken events for the two others", func() error {
		for _, n := range []string{decoy, plain} {
			evs, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=NameTaken,involvedObject.name=" + n})
			if err != nil || len(evs.Items) == 0 {
				return fmt.Errorf("no NameTaken event for %s (%v)", n, err)
			}
		}
		return nil
	})
	e.quiet("after the adoption", 3*time.Second)
	for _, n := range []string{decoy, plain} {
		got, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, n, metav1.GetOptions{})
		must(t, err)
		if got.ResourceVersion != theirs[n].ResourceVersion {
			t.Errorf("%s was written: resourceVersion %s, was %s", n, got.ResourceVersion, theirs[n].ResourceVersion)
		}
	}

	setMode(t, e, d, "endpointslices")
	e.waitSlices(web, web+"-4-8080-0[IPv4:8080]: 10.85.0.1=true/true/false")
	e.waitService(web, func(s *corev1.Service) error {
		if s.UID == adopted.UID || s.Spec.Type != corev1.ServiceTypeClusterIP {
			return fmt.Errorf("not converted: uid %s, spec %+v", s.UID, s.Spec)
		}
		return nil
	})
	e.quiet("after the conversion", 3*time.Second)
}
