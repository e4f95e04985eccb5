package k8s

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// BenchmarkService measures building one view of a Service with ten
// endpoints in two slices, the common case the supervisor pays per Changed.
func BenchmarkService(b *testing.B) {
	objs := []runtime.Object{newTestService("shop", "web")}
	for s := range 2 {
		slice := newTestSlice("shop", fmt.Sprintf("web-%d", s), "web", v4, ports(namedPort("http", 8080)))
		for i := range 5 {
			slice.Endpoints = append(slice.Endpoints, endpoint(fmt.Sprintf("p%d%d", s, i), fmt.Sprintf("10.0.%d.%d", s, i)))
		}
		objs = append(objs, slice)
	}
	w, _ := startWatcher(b, fake.NewClientset(objs...), 0)
	b.ReportAllocs()
	for b.Loop() {
		if svc, ok, err := w.Service(web); err != nil || !ok || len(svc.Endpoints) != 10 {
			b.Fatalf("Service() = %v, %v, %v", svc, ok, err)
		}
	}
}
