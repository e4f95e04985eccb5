package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeWatcher is an in-memory k8s.Watcher.
type fakeWatcher struct {
	mu       sync.Mutex
	services map[k8s.Key]*k8s.Service
	h        k8s.Handler
	synced   chan struct{}
}

func newFakeWatcher() *fakeWatcher {
	return &fakeWatcher{services: map[k8s.Key]*k8s.Service{}, synced: make(chan struct{})}
}

func (f *fakeWatcher) SetHandler(h k8s.Handler) { f.h = h }
func (f *fakeWatcher) Start(context.Context)    {}
func (f *fakeWatcher) Wait()                    {}
func (f *fakeWatcher) WaitForSync(ctx context.Context) bool {
	select {
	case <-f.synced:
		return true
	case <-ctx.Done():
		return false
	}
}
func (f *fakeWatcher) Service(key k8s.Key) (*k8s.Service, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[key]
	return s, ok, nil
}
func (f *fakeWatcher) Keys() []k8s.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]k8s.Key, 0, len(f.services))
	for k := range f.services {
		keys = append(keys, k)
	}
	return keys
}

// set stores svc (nil deletes key) and notifies.
func (f *fakeWatcher) set(key k8s.Key, svc *k8s.Service) {
	f.mu.Lock()
	if svc == nil {
		delete(f.services, key)
	} else {
		f.services[key] = svc
	}
	f.mu.Unlock()
	if f.h != nil {
		f.h.Changed(key)
	}
}

func service(ns, name string, ips ...string) *k8s.Service {
	s := &k8s.Service{Key: k8s.Key{Namespace: ns, Name: name}, Type: corev1.ServiceTypeClusterIP,
		Annotations: map[string]string{worker.AnnotationSync: "true"},
		Ports:       []k8s.Port{{Name: "http", Port: 80}}}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, k8s.Endpoint{Address: ip, Ports: map[string]int32{"http": 8080}, Ready: true, Serving: true})
	}
	return s
}

// memStore is an in-memory consul node: the twin of consul.Client.
type memStore struct {
	mu       sync.Mutex
	entries  map[string]consul.Registered
	index    uint64
	applies  int
	failRead error
	changed  chan struct{}
}

func newMemStore() *memStore {
	return &memStore{entries: map[string]consul.Registered{}, changed: make(chan struct{}, 1000)}
}

func (m *memStore) ReadNode(context.Context) ([]consul.Registered, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failRead != nil {
		return nil, m.failRead
	}
	out := make([]consul.Registered, 0, len(m.entries))
	for _, r := range m.entries {
		out = append(out, r)
	}
	return out, nil
}

func (m *memStore) ReadPrefix(ctx context.Context, prefix string) ([]consul.Registered, error) {
	all, err := m.ReadNode(ctx)
	var out []consul.Registered
	for _, r := range all {
		if strings.HasPrefix(r.ID, prefix) {
			out = append(out, r)
		}
	}
	return out, err
}

func (m *memStore) Apply(_ context.Context, ch consul.Change) (consul.Applied, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applies++
	var a consul.Applied
	for _, r := range ch.Deregister {
		delete(m.entries, r.ID)
		a.Deleted = append(a.Deleted, r.ID)
	}
	write := func(in consul.Instance, node string) {
		m.index++
		r := consul.Registered{Instance: in, Node: node, ServiceIndex: m.index, CheckIndex: m.index, HasCheck: true}
		m.entries[in.ID] = r
		a.Written = append(a.Written, r)
	}
	for _, in := range ch.Register {
		node := "k8s-test" // the client's owner's node
		if ch.NodeFor != nil {
			node = ch.NodeFor(in.ID)
		}
		write(in, node)
	}
	for _, u := range ch.Update {
		write(u.Want, u.Have.Node)
	}
	a.Txns = 1
	m.changed <- struct{}{}
	return a, nil
}

func (m *memStore) count(prefix string) int {
	n, _ := m.ReadPrefix(context.Background(), prefix)
	return len(n)
}

func memOf(s Store) *memStore {
	switch s := s.(type) {
	case *memStore:
		return s
	case *failingStore:
		return s.memStore
	case *watchStore:
		return s.memStore
	case *downStore:
		return s.memStore
	case *witnessStore:
		return s.memStore
	case *outageStore:
		return s.memStore
	}
	panic("unknown store")
}

type fixture struct {
	w       *fakeWatcher
	store   *memStore
	sup     *Supervisor
	cluster ownership.Cluster
	cancel  context.CancelFunc
	done    chan error
	once    sync.Once
}

func start(t *testing.T, w *fakeWatcher, store *memStore) *fixture {
	t.Helper()
	return startWith(t, w, store, nil)
}

// startWith runs a supervisor over w and store; edit runs before Run.
func startWith(t *testing.T, w *fakeWatcher, store Store, edit func(*Supervisor)) *fixture {
	t.Helper()
	cluster, err := ownership.New("test")
	if err != nil {
		t.Fatal(err)
	}
	sup := New(Options{
		Selector: Selector{Allow: []string{"*"}, Deny: []string{"kube-system"}},
		Worker:   worker.Config{Cluster: cluster, DefaultWindow: 0, Terminating: worker.TerminatingWarning},
		Watcher:  w, Store: store,
	})
	if edit != nil {
		edit(sup)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{w: w, store: memOf(store), sup: sup, cluster: cluster, cancel: cancel, done: make(chan error, 1)}
	go func() { f.done <- sup.Run(ctx) }()
	t.Cleanup(f.stop)
	return f
}

func (f *fixture) stop() {
	f.once.Do(func() {
		f.cancel()
		<-f.done
	})
}

// waitFor re-checks cond on every store write (and every 10ms, for
// conditions on the supervisor itself) until it holds.
func (f *fixture) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-f.store.changed:
		case <-time.After(10 * time.Millisecond):
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestBootstrapStartsWorkersAndReapsDeletedServices(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	cluster, _ := ownership.New("test")
	// An instance of a Service deleted while fleetsync was down.
	gone := cluster.Stamp(consul.Instance{ID: cluster.InstanceID("ns", "gone", "10.0.0.9", 80), Name: "gone",
		Meta: map[string]string{worker.MetaNamespace: "ns", worker.MetaService: "gone"}})
	store.entries[gone.ID] = consul.Registered{Instance: gone, Node: cluster.NodeName(), ServiceIndex: 1, HasCheck: true}
	w.services[k8s.Key{Namespace: "ns", Name: "a"}] = service("ns", "a", "10.0.0.1", "10.0.0.2")
	w.services[k8s.Key{Namespace: "kube-system", Name: "dns"}] = service("kube-system", "dns", "10.0.0.3")

	f := start(t, w, store)
	if f.sup.Bootstrapped() {
		t.Fatal("bootstrapped before the informers synced")
	}
	close(w.synced)
	f.waitFor(t, "a registered and gone reaped", func() bool {
		return store.count(cluster.IDPrefix("ns", "a")) == 2 && store.count(cluster.IDPrefix("ns", "gone")) == 0
	})
	if n := store.count(cluster.IDPrefix("kube-system", "dns")); n != 0 {
		t.Errorf("denied namespace synced: %d instances", n)
	}
	f.waitFor(t, "the reaping worker to end", func() bool { return f.sup.Len() == 1 })
}

func TestConsulUnreachableAtStartDelaysBootstrap(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	store.failRead = errors.New("connection refused")
	w.services[k8s.Key{Namespace: "ns", Name: "a"}] = service("ns", "a", "10.0.0.1")
	close(w.synced)
	f := start(t, w, store)
	// While Consul cannot be read, nothing is written and the fleet is not ready.
	if f.sup.Bootstrapped() || store.applies != 0 {
		t.Fatalf("bootstrapped=%v applies=%d with Consul unreachable", f.sup.Bootstrapped(), store.applies)
	}
	store.mu.Lock()
	store.failRead = nil
	store.mu.Unlock()
	f.waitFor(t, "a registered once Consul answers", func() bool { return store.count("") == 1 })
}

func TestEventsRouteToWorkersAndDeletesDeregister(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	close(w.synced)
	f := start(t, w, store)
	key := k8s.Key{Namespace: "ns", Name: "a"}
	f.waitFor(t, "bootstrap", f.sup.Bootstrapped)
	w.set(key, service("ns", "a", "10.0.0.1"))
	f.waitFor(t, "one instance", func() bool { return store.count("") == 1 })
	w.set(key, service("ns", "a", "10.0.0.1", "10.0.0.2", "10.0.0.3"))
	f.waitFor(t, "three instances", func() bool { return store.count("") == 3 })
	w.set(key, nil)
	f.waitFor(t, "deregistered", func() bool { return store.count("") == 0 })
	f.waitFor(t, "worker gone", func() bool { return f.sup.Len() == 0 })
	// Back again: a new worker.
	w.set(key, service("ns", "a", "10.0.0.4"))
	f.waitFor(t, "re-created", func() bool { return store.count("") == 1 })
}

func TestManyWorkersStopCleanly(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	for i := range 200 {
		k := k8s.Key{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}
		w.services[k] = service("ns", k.Name, fmt.Sprintf("10.1.%d.1", i))
	}
	close(w.synced)
	f := start(t, w, store)
	f.waitFor(t, "200 instances", func() bool { return store.count("") == 200 })
	if f.sup.Len() != 200 {
		t.Fatalf("%d workers, want 200", f.sup.Len())
	}
	f.stop() // goleak.VerifyTestMain checks that no goroutine outlives Run
	if st := f.sup.Workers(); len(st) != 0 {
		t.Errorf("%d workers left after Run returned", len(st))
	}
}

func TestSelector(t *testing.T) {
	s := Selector{DefaultSync: false, Allow: []string{"*"}, Deny: []string{"kube-system", "tmp-*"}}
	cases := []struct {
		name string
		svc  *k8s.Service
		want bool
	}{
		{"opted in", service("ns", "a"), true},
		{"no annotation, default false", &k8s.Service{Key: k8s.Key{Namespace: "ns", Name: "b"}}, false},
		{"opted out", func() *k8s.Service {
			x := service("ns", "c")
			x.Annotations = map[string]string{worker.AnnotationSync: "false"}
			return x
		}(), false},
		{"garbage value goes to the worker to report", func() *k8s.Service {
			x := service("ns", "c")
			x.Annotations = map[string]string{worker.AnnotationSync: "yes please"}
			return x
		}(), true},
		{"denied namespace", service("kube-system", "d"), false},
		{"denied glob", service("tmp-1", "d"), false},
		{"external name", func() *k8s.Service { x := service("ns", "e"); x.Type = corev1.ServiceTypeExternalName; return x }(), false},
		{"nil", nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := s.Selected(c.svc); got != c.want {
				t.Errorf("Selected = %v, want %v", got, c.want)
			}
		})
	}
	// --sync-clusterip-services=false: ClusterIP (headless too) is left
	// out, the other types are not.
	noCIP := Selector{DefaultSync: true, Allow: []string{"*"}, SkipClusterIP: true}
	for typ, want := range map[corev1.ServiceType]bool{
		corev1.ServiceTypeClusterIP: false, corev1.ServiceTypeNodePort: true, corev1.ServiceTypeLoadBalancer: true,
	} {
		x := service("ns", "t")
		x.Type = typ
		if got := noCIP.Selected(x); got != want {
			t.Errorf("SkipClusterIP: Selected(%s) = %v, want %v", typ, got, want)
		}
		if !s.Selected(x) {
			t.Errorf("without SkipClusterIP: Selected(%s) = false", typ)
		}
	}
	if err := (Selector{Allow: []string{"["}}).Validate(); err == nil {
		t.Error("bad pattern accepted")
	}
}

// lockedBuffer is a log sink safe to read while the supervisor writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAdvisesConsulNodes: more selected Services than 100 per Consul node
// get a warning that names the counts and the advised --consul-nodes;
// 100 per node, or Services not selected, do not.
func TestAdvisesConsulNodes(t *testing.T) {
	for _, tc := range []struct {
		selected, denied, nodes int
		want                    string
	}{
		{selected: 100, denied: 50, nodes: 1},
		{selected: 101, nodes: 1, want: "services=101 consul_nodes=1 advised_consul_nodes=2"},
		{selected: 250, denied: 10, nodes: 1, want: "services=250 consul_nodes=1 advised_consul_nodes=3"},
		{selected: 250, nodes: 3},
		{selected: 301, nodes: 3, want: "services=301 consul_nodes=3 advised_consul_nodes=4"},
	} {
		t.Run(fmt.Sprintf("%d+%d/%d", tc.selected, tc.denied, tc.nodes), func(t *testing.T) {
			w, store := newFakeWatcher(), newMemStore()
			for i := range tc.selected {
				w.services[k8s.Key{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}] = service("ns", fmt.Sprintf("s%d", i))
			}
			for i := range tc.denied {
				w.services[k8s.Key{Namespace: "kube-system", Name: fmt.Sprintf("d%d", i)}] = service("kube-system", fmt.Sprintf("d%d", i))
			}
			close(w.synced)
			var logs lockedBuffer
			f := startWith(t, w, store, func(s *Supervisor) {
				s.log = hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
				var err error
				if s.opts.Worker.Cluster, err = s.opts.Worker.Cluster.WithNodes(tc.nodes); err != nil {
					t.Fatal(err)
				}
			})
			f.waitFor(t, "bootstrap", f.sup.Bootstrapped)
			warned := strings.Contains(logs.String(), "More Services per Consul node than advised")
			if tc.want == "" && warned {
				t.Errorf("warned with %d selected Services on %d nodes: %s", tc.selected, tc.nodes, logs.String())
			}
			if tc.want != "" && (!warned || !strings.Contains(logs.String(), tc.want)) {
				t.Errorf("log %q, want the advice with %q", logs.String(), tc.want)
			}
		})
	}
}
