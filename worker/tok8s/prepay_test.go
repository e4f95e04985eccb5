package tok8s

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/consul/watch"
)

// TestFlushPrepaysItsWrites: a flush prepays its writes before the first:
// a mirror's first flush the Service's create and its slices' creates
// together, a later one the writes of its change; an import its slices;
// a flush with nothing to write prepays nothing.
func TestFlushPrepaysItsWrites(t *testing.T) {
	a, b := vm("a", "10.0.0.1", 80, "passing"), vm("b", "fd00::2", 80, "passing")
	aCrit := vm("a", "10.0.0.1", 80, "critical")
	target := &corev1.Service{}
	target.Name, target.Namespace, target.UID = "web", "ns", "uid"
	steps := []struct {
		name    string
		mirror  bool
		answer  []watch.Entry
		prepaid []int
		writes  int
	}{
		{"mirror: first flush", true, []watch.Entry{a, b}, []int{3}, 3}, // the Service, an IPv4 and an IPv6 slice
		{"mirror: one check", true, []watch.Entry{aCrit, b}, []int{1}, 1},
		{"mirror: nothing changed", true, []watch.Entry{aCrit, b}, nil, 0},
		{"import: first flush", false, []watch.Entry{a, b}, []int{2}, 2},
	}
	var f *fakeK8s
	var w *Worker
	for _, st := range steps {
		u := Unit{Namespace: "ns", Name: "web", ConsulName: "web", PortName: PortName, Mirror: st.mirror}
		if w == nil || !st.mirror && w.opts.Unit.Mirror {
			f = newFake()
			w = New(Options{Unit: u, Config: testConfig(t), Owned: f, Writer: f,
				Lookup: func() (Unit, *corev1.Service, bool) { return u, target, true }})
		}
		f.prepaid = nil
		w.deliver(watch.Instances{Entries: st.answer})
		wrote, _, err := w.flush(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if wrote != st.writes || !slices.Equal(f.prepaid, st.prepaid) {
			t.Fatalf("%s: wrote %d, prepaid %v; want %d and %v (writes %v)", st.name, wrote, f.prepaid, st.writes, st.prepaid, f.writes)
		}
	}
}
