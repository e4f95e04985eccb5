package tok8s

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fleetsync/fleetsync/consul/watch"
)

type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) Warning(_ runtime.Object, reason, _ string) {
	e.mu.Lock()
	e.got = append(e.got, reason)
	e.mu.Unlock()
}

// view is the fake's slices: "name: addr=ready ..." sorted.
func (f *fakeK8s) view() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, s := range f.slices {
		var eps []string
		for _, ep := range s.Endpoints {
			eps = append(eps, fmt.Sprintf("%s=%v", ep.Addresses[0], *ep.Conditions.Ready))
		}
		slices.Sort(eps)
		out = append(out, s.Name+": "+strings.Join(eps, " "))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// TestFilteredAnswerKeepsMirrored: answers Consul filtered by ACLs never
// remove a mirrored endpoint; the instances they still have are updated;
// one Event and Status.Held for the whole hold; the first unfiltered
// answer is applied as it is.
func TestFilteredAnswerKeepsMirrored(t *testing.T) {
	f := newFake()
	ev := &events{}
	target := &corev1.Service{}
	target.Name, target.Namespace, target.UID = "web", "ns", "uid"
	u := Unit{Namespace: "ns", Name: "web", ConsulName: "web", PortName: "http"}
	w := New(Options{Unit: u, Config: testConfig(t), Owned: f, Writer: f, Reporter: ev,
		Lookup: func() (Unit, *corev1.Service, bool) { return u, target, true }})
	a, b := vm("a", "10.0.0.1", 80, "passing"), vm("b", "10.0.0.2", 80, "passing")
	aCrit := vm("a", "10.0.0.1", 80, "critical")
	steps := []struct {
		name      string
		answer    watch.Instances
		want      string
		writes    int
		held      string
		eventsNow int
	}{
		{"whole", watch.Instances{Entries: []watch.Entry{a, b}}, "web-4-80-0: 10.0.0.1=true 10.0.0.2=true", 1, "", 0},
		{"filtered, b dropped, a critical", watch.Instances{Entries: []watch.Entry{aCrit}, FilteredByACLs: true},
			"web-4-80-0: 10.0.0.1=false 10.0.0.2=true", 1, HeldFilteredByACLs, 1},
		{"filtered again, a passing", watch.Instances{Entries: []watch.Entry{a}, FilteredByACLs: true},
			"web-4-80-0: 10.0.0.1=true 10.0.0.2=true", 1, HeldFilteredByACLs, 1},
		{"filtered, nothing left", watch.Instances{FilteredByACLs: true}, "web-4-80-0: 10.0.0.1=true 10.0.0.2=true", 0, HeldFilteredByACLs, 1},
		{"whole again, b gone", watch.Instances{Entries: []watch.Entry{a}}, "web-4-80-0: 10.0.0.1=true", 1, "", 1},
	}
	ctx := context.Background()
	for _, st := range steps {
		w.deliver(st.answer)
		wrote, _, err := w.flush(ctx)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := f.view(); got != st.want || wrote != st.writes {
			t.Errorf("%s: %q in %d writes, want %q in %d", st.name, got, wrote, st.want, st.writes)
		}
		if got := w.Status().Held; got != st.held {
			t.Errorf("%s: Held %q, want %q", st.name, got, st.held)
		}
		if len(ev.got) != st.eventsNow {
			t.Errorf("%s: Events %v, want %d", st.name, ev.got, st.eventsNow)
		}
	}
	if len(ev.got) == 0 || ev.got[0] != ReasonFilteredByACLs {
		t.Errorf("Events %v, want %s first", ev.got, ReasonFilteredByACLs)
	}
}

// TestStreamedAnswerIsConfirmed: a streamed answer (which never says it
// was filtered) that drops an instance, or that follows a filtered answer,
// is read again with index 0; any other answer is taken as it is.
func TestStreamedAnswerIsConfirmed(t *testing.T) {
	a, b := vm("a", "10.0.0.1", 80, "passing"), vm("b", "10.0.0.2", 80, "passing")
	confirm := watch.Instances{Entries: []watch.Entry{a}, FilteredByACLs: true}
	tests := []struct {
		name   string
		last   watch.Instances
		answer watch.Instances
		reread bool
	}{
		{"streamed, drops b", watch.Instances{Entries: []watch.Entry{a, b}}, watch.Instances{Entries: []watch.Entry{a}, Streamed: true}, true},
		{"streamed, drops nothing", watch.Instances{Entries: []watch.Entry{a}}, watch.Instances{Entries: []watch.Entry{a, b}, Streamed: true}, false},
		{"streamed after a filtered answer", watch.Instances{Entries: []watch.Entry{a}, FilteredByACLs: true},
			watch.Instances{Entries: []watch.Entry{a}, Streamed: true}, true},
		{"RPC backend, drops b", watch.Instances{Entries: []watch.Entry{a, b}}, watch.Instances{Entries: []watch.Entry{a}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var indexes []uint64
			w := New(Options{Unit: Unit{ConsulName: "web"}, Health: func(_ context.Context, _ string, index uint64) (watch.Instances, uint64, error) {
				indexes = append(indexes, index)
				if index == 0 {
					return confirm, 12, nil
				}
				return tt.answer, 11, nil
			}})
			got, index, err := w.read(context.Background(), 10, tt.last)
			if err != nil {
				t.Fatal(err)
			}
			want, wantIndex, wantReads := tt.answer, uint64(11), []uint64{10}
			if tt.reread {
				want, wantIndex, wantReads = confirm, 12, []uint64{10, 0}
			}
			if !slices.Equal(indexes, wantReads) || index != wantIndex || got.FilteredByACLs != want.FilteredByACLs || len(got.Entries) != len(want.Entries) {
				t.Errorf("reads %v, answer %+v at %d; want reads %v, %+v at %d", indexes, got, index, wantReads, want, wantIndex)
			}
		})
	}
}

// TestEmptyAnswerWaitsForTheCatalog: an import unit whose Consul name the
// catalog still lists, or that the deletion guard holds
// (Unit.CatalogDecides), keeps its slices on an empty health answer; once
// the catalog lets the name go, the empty answer is applied.
func TestEmptyAnswerWaitsForTheCatalog(t *testing.T) {
	f := newFake()
	target := &corev1.Service{}
	target.Name, target.Namespace, target.UID = "web", "ns", "uid"
	u := Unit{Namespace: "ns", Name: "web", ConsulName: "web", PortName: "http", CatalogDecides: true}
	var mu sync.Mutex
	w := New(Options{Unit: u, Config: testConfig(t), Owned: f, Writer: f,
		Lookup: func() (Unit, *corev1.Service, bool) { mu.Lock(); defer mu.Unlock(); return u, target, true }})
	ctx := context.Background()
	w.deliver(watch.Instances{Entries: []watch.Entry{vm("a", "10.0.0.1", 80, "passing")}})
	if _, _, err := w.flush(ctx); err != nil || f.view() != "web-4-80-0: 10.0.0.1=true" {
		t.Fatalf("first flush: %q, %v", f.view(), err)
	}
	w.deliver(watch.Instances{})
	if n, _, err := w.flush(ctx); err != nil || n != 0 || f.view() != "web-4-80-0: 10.0.0.1=true" {
		t.Fatalf("empty answer while the catalog decides: %d writes, %q, %v", n, f.view(), err)
	}
	mu.Lock()
	u.CatalogDecides = false
	mu.Unlock()
	if n, _, err := w.flush(ctx); err != nil || n != 1 || f.view() != "" {
		t.Fatalf("empty answer once the catalog let the name go: %d writes, %q, %v", n, f.view(), err)
	}
}
