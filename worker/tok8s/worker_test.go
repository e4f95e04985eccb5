package tok8s

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fleetsync/fleetsync/consul/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeK8s is the owned cache and the writer at once: what is written is
// what the next look sees (a cache that is never behind).
type fakeK8s struct {
	mu      sync.Mutex
	slices  map[string]*discoveryv1.EndpointSlice
	svc     *corev1.Service // the mirrored Service, once created
	rv      int
	writes  []string
	prepaid []int // each Prepay's n
	wrote   chan string
}

func newFake() *fakeK8s {
	return &fakeK8s{slices: map[string]*discoveryv1.EndpointSlice{}, wrote: make(chan string, 100)}
}

func (f *fakeK8s) Slices(ns, name string) []*discoveryv1.EndpointSlice {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*discoveryv1.EndpointSlice
	for _, s := range f.slices {
		out = append(out, s)
	}
	return out
}
func (f *fakeK8s) Service(ns, name string) (*corev1.Service, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.svc, f.svc != nil
}

func (f *fakeK8s) record(verb string, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	s = s.DeepCopy()
	s.ResourceVersion = strconv.Itoa(f.rv)
	if verb == "delete" {
		delete(f.slices, s.Name)
	} else {
		f.slices[s.Name] = s
	}
	f.writes = append(f.writes, verb+" "+s.Name)
	f.wrote <- verb + " " + s.Name
	return s
}

func (f *fakeK8s) CreateSlice(_ context.Context, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	return f.record("create", s), nil
}
func (f *fakeK8s) UpdateSlice(_ context.Context, _, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	return f.record("update", s), nil
}
func (f *fakeK8s) DeleteSlice(_ context.Context, s *discoveryv1.EndpointSlice) error {
	f.record("delete", s)
	return nil
}
func (f *fakeK8s) CreateService(_ context.Context, svc *corev1.Service) (*corev1.Service, error) {
	return f.recordService("create", svc), nil
}
func (f *fakeK8s) UpdateService(_ context.Context, _, svc *corev1.Service) (*corev1.Service, error) {
	return f.recordService("update", svc), nil
}
func (f *fakeK8s) DeleteService(context.Context, *corev1.Service) error {
	return errors.New("not in these tests")
}
func (f *fakeK8s) AdoptService(context.Context, *corev1.Service, func(*corev1.Service) (*corev1.Service, error)) (*corev1.Service, error) {
	return nil, errors.New("not in these tests")
}

// recordService stores the mirrored Service (UID uid-<name>).
func (f *fakeK8s) recordService(verb string, svc *corev1.Service) *corev1.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	svc = svc.DeepCopy()
	svc.ResourceVersion, svc.UID = strconv.Itoa(f.rv), types.UID("uid-"+svc.Name)
	f.svc = svc
	f.writes = append(f.writes, verb+" svc/"+svc.Name)
	return svc
}

// Prepay records n; the fake has no budget.
func (f *fakeK8s) Prepay(ctx context.Context, n int) (context.Context, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prepaid = append(f.prepaid, n)
	return ctx, nil
}

// fakeHealth answers the health query from a channel of answers: the first
// query blocks until the test sends one.
type fakeHealth struct{ answers chan watch.Instances }

func (h *fakeHealth) query(ctx context.Context, _ string, index uint64) (watch.Instances, uint64, error) {
	select {
	case a := <-h.answers:
		return a, index + 1, nil
	case <-ctx.Done():
		return watch.Instances{}, 0, ctx.Err()
	}
}

// TestNothingBeforeGateAndFirstHealth: a worker writes nothing before the
// fleet's gate opens and its own first health answer arrives, then
// writes the slice once; a unit no longer selected has its slice deleted,
// and the worker looks again by itself after its writes and ends (no event
// comes after the delete here).
func TestNothingBeforeGateAndFirstHealth(t *testing.T) {
	c := testConfig(t)
	f := newFake()
	h := &fakeHealth{answers: make(chan watch.Instances)}
	gate := make(chan struct{})
	var mu sync.Mutex
	selected := true
	target := &corev1.Service{}
	target.Name, target.Namespace, target.UID = "web", "ns", "uid"
	u := Unit{Namespace: "ns", Name: "web", ConsulName: "web", PortName: "http"}
	w := New(Options{Unit: u, Config: c, Owned: f, Writer: f, Health: h.query, Gate: gate,
		Lookup: func() (Unit, *corev1.Service, bool) { mu.Lock(); defer mu.Unlock(); return u, target, selected }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	entries := []watch.Entry{vm("a", "10.0.0.1", 80, "passing")}
	h.answers <- watch.Instances{Entries: entries} // the first health answer, gate still shut
	for !w.Known() {
		time.Sleep(time.Millisecond) // the answer is delivered on the watch goroutine
	}
	select {
	case got := <-f.wrote:
		t.Fatalf("wrote %q before the gate opened", got)
	default:
	}
	close(gate)
	if got := <-f.wrote; got != "create web-4-80-0" {
		t.Fatalf("first write %q", got)
	}
	mu.Lock()
	selected = false
	mu.Unlock()
	w.Notify()
	if got := <-f.wrote; got != "delete web-4-80-0" {
		t.Fatalf("after deselection: %q (all: %v)", got, f.writes)
	}
	if err := <-done; !errors.Is(err, ErrFinished) {
		t.Fatalf("Run = %v, want ErrFinished", err)
	}
	if len(f.writes) != 2 {
		t.Fatalf("writes %v, want one create and one delete", f.writes)
	}
}

// TestLaggingCacheWaits: a look while the cache does not show this
// worker's last write yet writes nothing (it would create again).
func TestLaggingCacheWaits(t *testing.T) {
	w := New(Options{Config: testConfig(t)})
	w.wrote["a"], w.wroteAt = "12", w.opts.Clock.Now()
	s := &discoveryv1.EndpointSlice{}
	s.Name, s.ResourceVersion = "a", "11"
	if !w.lagging([]*discoveryv1.EndpointSlice{s}, nil) {
		t.Fatal("an older version in the cache is not lagging")
	}
	if !w.lagging(nil, nil) {
		t.Fatal("a created slice missing from the cache is not lagging")
	}
	s.ResourceVersion = "13" // someone wrote after us: caught up
	if w.lagging([]*discoveryv1.EndpointSlice{s}, nil) || len(w.wrote) != 0 {
		t.Fatalf("a newer version is lagging (%v)", w.wrote)
	}
	w.wrote["b"], w.wroteAt = "", w.opts.Clock.Now() // deleted by us
	b := &discoveryv1.EndpointSlice{}
	b.Name = "b"
	if !w.lagging([]*discoveryv1.EndpointSlice{b}, nil) || w.lagging(nil, nil) {
		t.Fatal("a deleted slice: lagging while cached, not once gone")
	}
}
