package supervisor

import (
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/worker"
)

// TestNameIndex: a Service that joins another under one Consul name is
// reported when one of the names is derived, once; a merge by annotation
// on both sides is not.
func TestNameIndex(t *testing.T) {
	a, b, c := k8s.Key{Namespace: "a-b", Name: "web"}, k8s.Key{Namespace: "b", Name: "web-a"}, k8s.Key{Namespace: "x", Name: "api"}
	var x nameIndex
	steps := []struct {
		key     k8s.Key
		name    string
		derived bool
		want    []k8s.Key
	}{
		{a, "web-a-b", true, nil},
		{b, "web-a-b", true, []k8s.Key{a}}, // --add-namespace-suffix collision
		{b, "web-a-b", true, nil},          // the same again: not reported twice
		{c, "shared", false, nil},
		{a, "shared", false, nil}, // both by annotation: on purpose
		{b, "shared", true, []k8s.Key{a, c}},
		{c, "Web-A-B", true, nil},          // alone under a name Consul compares without case
		{a, "web-a-b", true, []k8s.Key{c}}, // so this is the same name
	}
	for i, st := range steps {
		if got := x.set(st.key, st.name, st.derived); !slices.Equal(got, st.want) {
			t.Fatalf("step %d (%s -> %s): others %v, want %v", i, st.key, st.name, got, st.want)
		}
	}
	x.remove(a)
	x.remove(c)
	if got := x.set(a, "SHARED", false); !slices.Equal(got, []k8s.Key{b}) {
		t.Fatalf("after removals: %v", got)
	}
}

type recordingReporter struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recordingReporter) Warning(_ k8sruntime.Object, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, reason+": "+msg)
}

func (r *recordingReporter) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// TestNamespaceSuffixCollisionIsReported: with --add-namespace-suffix,
// web in a-b and web-a in b are both web-a-b in Consul: reported.
func TestNamespaceSuffixCollisionIsReported(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	for _, k := range []k8s.Key{{Namespace: "a-b", Name: "web"}, {Namespace: "b", Name: "web-a"}} {
		svc := service(k.Namespace, k.Name, "10.3.0.1")
		svc.Object = &corev1.Service{}
		w.services[k] = svc
	}
	close(w.synced)
	rep := &recordingReporter{}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Worker.AddNamespaceSuffix = true
		s.opts.Reporter = rep
	})
	f.waitFor(t, "a collision report", func() bool { return len(rep.got()) > 0 })
	msg := rep.got()[0]
	for _, want := range []string{ReasonNameCollision, `"web-a-b"`, "a-b/web", "b/web-a"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("report %q does not mention %s", msg, want)
		}
	}
	f.waitFor(t, "both synced", func() bool { return store.count("") == 2 })
	if n := len(rep.got()); n != 1 {
		t.Fatalf("%d reports, want 1: %v", n, rep.got())
	}
}

// TestNameCollisionIgnoresCase: Consul compares service names without
// case, so a Service annotated service-name: Web and a Service named web
// are one Consul service: reported as a collision.
func TestNameCollisionIgnoresCase(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	annotated, plain := k8s.Key{Namespace: "a", Name: "frontend"}, k8s.Key{Namespace: "b", Name: "web"}
	for _, k := range []k8s.Key{annotated, plain} {
		svc := service(k.Namespace, k.Name, "10.3.0.1")
		svc.Object = &corev1.Service{}
		w.services[k] = svc
	}
	w.services[annotated].Annotations[worker.AnnotationName] = "Web"
	close(w.synced)
	rep := &recordingReporter{}
	f := startWith(t, w, store, func(s *Supervisor) { s.opts.Reporter = rep })
	f.waitFor(t, "a collision report", func() bool { return len(rep.got()) > 0 })
	msg := rep.got()[0]
	for _, want := range []string{ReasonNameCollision, "a/frontend", "b/web"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("report %q does not mention %s", msg, want)
		}
	}
}
