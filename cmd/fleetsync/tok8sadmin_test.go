package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/fleetsync/fleetsync/k8s/apply"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

func markedObjects(t *testing.T) []runtime.Object {
	t.Helper()
	east, _ := k8smark.New("east")
	west, _ := k8smark.New("west")
	yes, no := true, false
	svc := func(m *k8smark.Mark, ns, name, consul string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("u-" + name), ResourceVersion: "1",
			Annotations: map[string]string{k8smark.AnnotationConsulService: consul}}}
		if m != nil {
			m.Stamp(s)
		}
		return s
	}
	slice := func(m k8smark.Mark, ns, svc, name string, ready ...bool) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("u-" + name), ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: discoveryv1.AddressTypeIPv4}
		for _, r := range ready {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &r}})
		}
		m.Stamp(s)
		return s
	}
	return []runtime.Object{
		svc(&east, "mirror", "web", "web"), slice(east, "mirror", "web", "web-4-80-0", yes, no), slice(east, "mirror", "web", "web-6-80-0", yes),
		svc(nil, "apps", "db", "postgres"), slice(east, "apps", "db", "db-4-5432-0", yes), // import mode: the user's Service
		svc(&west, "mirror", "web-west", "web"), slice(west, "mirror", "web-west", "web-west-4-80-0", yes), // another cluster's
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "mirror", Name: "other"}}, // nobody's
	}
}

// TestListMirrored: status --to-k8s groups the marked objects by cluster
// and Service; import mode's Consul name comes from the user's Service.
func TestListMirrored(t *testing.T) {
	kube := fake.NewClientset(markedObjects(t)...)
	ms, err := listMirrored(context.Background(), kube, k8smark.LabelManagedBy+"="+k8smark.ManagedBy)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := writeMirroredTable(&b, ms); err != nil {
		t.Fatal(err)
	}
	want := `CLUSTER  NAMESPACE  SERVICE   CONSUL SERVICE  MODE    SLICES  ENDPOINTS  READY
east     apps       db        postgres        import  1       1          1
east     mirror     web       web             mirror  2       3          2
west     mirror     web-west  web             mirror  1       1          1
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestPurgeMirrored: purge --to-k8s deletes exactly one cluster's marked
// objects: the mirrored Service and every marked slice, never the user's
// import-mode Service, another cluster's objects or unmarked ones.
func TestPurgeMirrored(t *testing.T) {
	kube := fake.NewClientset(markedObjects(t)...)
	east, _ := k8smark.New("east")
	ctx := context.Background()
	ms, err := listMirrored(ctx, kube, east.Selector())
	if err != nil {
		t.Fatal(err)
	}
	w, err := apply.New(kube, east, apply.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := purgeMirrored(ctx, w, ms)
	if err != nil || n != 4 {
		t.Fatalf("deleted %d (%v), want 4", n, err)
	}
	var left []string
	svcs, _ := kube.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	for _, s := range svcs.Items {
		left = append(left, "svc "+s.Namespace+"/"+s.Name)
	}
	slices, _ := kube.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	for _, s := range slices.Items {
		left = append(left, "slice "+s.Namespace+"/"+s.Name)
	}
	if got, want := strings.Join(left, ", "), "svc apps/db, svc mirror/other, svc mirror/web-west, slice mirror/web-west-4-80-0"; got != want {
		t.Errorf("left %s, want %s", got, want)
	}
}
