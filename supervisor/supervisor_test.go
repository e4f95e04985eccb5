package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/k8stest"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
	"github.com/fleetsync/fleetsync/worker"
)

func TestMain(m *testing.M) {
	code := m.Run()
	twinsMu.Lock()
	for _, tw := range twins {
		tw.Close()
	}
	twinsMu.Unlock()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// twins are the memStores' Consul twins, closed after the tests (the shard
// tests build memStores without a *testing.T).
var (
	twinsMu sync.Mutex
	twins   []*consultest.Server
)

// fakeWatcher is k8stest's Watcher, plus the two fields the shard tests
// (leases_test.go, shards_test.go) fill before the supervisor starts:
// services, loaded into the watcher once synced is closed.
type fakeWatcher struct {
	*k8stest.Watcher
	services map[k8s.Key]*k8s.Service
	synced   chan struct{}
	load     sync.Once
}

func newFakeWatcher() *fakeWatcher {
	return &fakeWatcher{Watcher: k8stest.New(), services: map[k8s.Key]*k8s.Service{}, synced: make(chan struct{})}
}

func (f *fakeWatcher) WaitForSync(ctx context.Context) bool {
	select {
	case <-f.synced:
	case <-ctx.Done():
		return false
	}
	f.load.Do(func() {
		for _, svc := range f.services {
			f.Watcher.Set(svc)
		}
		f.Watcher.Synced()
	})
	return f.Watcher.WaitForSync(ctx)
}

// set stores svc (nil deletes key) and notifies.
func (f *fakeWatcher) set(key k8s.Key, svc *k8s.Service) {
	if svc == nil {
		f.Watcher.Delete(key)
		return
	}
	f.Watcher.Set(svc)
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

// memStore is the supervisor's Store in these tests: the real consul.Client
// of cluster "test" on the Consul twin (consul/consultest); it counts
// applies and signals every write. startWith binds it to the supervisor's
// cluster (its number of nodes).
type memStore struct {
	*consul.Client
	twin  *consultest.Server
	other *api.Client // someone else writing to the catalog

	mu      sync.Mutex
	applies int
	cluster ownership.Cluster
	changed chan struct{}
}

func newMemStore() *memStore {
	twin := consultest.NewServer()
	twinsMu.Lock()
	twins = append(twins, twin)
	twinsMu.Unlock()
	m := &memStore{twin: twin, other: twin.Client(), changed: make(chan struct{}, 1000)}
	cluster, _ := ownership.New("test")
	m.bind(cluster, nil)
	return m
}

// bind makes the store the client of cluster (before the supervisor runs),
// on the supervisor's clock (nil: the real one): the witnesses' times are
// compared with it.
func (m *memStore) bind(cluster ownership.Cluster, clk clock.PassiveClock) {
	m.cluster = cluster
	var now func() time.Time
	if clk != nil {
		now = clk.Now
	}
	// The marks are read on every call (consul.TestCatalogMarksAreSharedForMaxAge
	// tests the sharing).
	m.Client = consul.NewClient(m.twin.Client(), cluster, consul.Options{MarksMaxAge: -1, Now: now})
}

func (m *memStore) Apply(ctx context.Context, ch consul.Change) (consul.Applied, error) {
	m.mu.Lock()
	m.applies++
	m.mu.Unlock()
	defer func() { m.changed <- struct{}{} }()
	return m.Client.Apply(ctx, ch)
}

// reader is a client of the store's cluster for the test's own reads and
// writes (it shares no state with the supervisor's).
func (m *memStore) reader() *consul.Client {
	big, _ := m.cluster.WithNodes(ownership.MaxNodes)
	return consul.NewClient(m.twin.Client(), big, consul.Options{})
}

// count counts the entries on the cluster's nodes whose ID has prefix.
func (m *memStore) count(prefix string) int {
	n, err := m.reader().ReadPrefix(context.Background(), prefix)
	if err != nil {
		panic(err)
	}
	return len(n)
}

// put writes in on node, as an earlier fleetsync did.
func (m *memStore) put(in consul.Instance, node string) {
	if _, err := m.reader().Apply(context.Background(), consul.Change{Register: []consul.Instance{in}, NodeFor: func(string) string { return node }}); err != nil {
		panic(err)
	}
}

// loseOne deletes one of the cluster's entries behind the fleet's back, as
// a loss or a restore would.
func (m *memStore) loseOne() {
	all, err := m.reader().ReadPrefix(context.Background(), "")
	if err != nil || len(all) == 0 {
		panic(fmt.Sprintf("nothing to lose: %v", err))
	}
	if _, err := m.other.Catalog().Deregister(&api.CatalogDeregistration{Node: all[0].Node, ServiceID: all[0].ID}, nil); err != nil {
		panic(err)
	}
}

// down makes every request to Consul fail as an unreachable one does
// (false: answered again).
func (m *memStore) down(down bool) {
	if !down {
		m.twin.SetFault(nil)
		return
	}
	m.twin.SetFault(func(*http.Request) error { return errRefused })
}

var errRefused = errors.New("dial tcp 127.0.0.1:8500: connect: connection refused")

// instanceNodes names the node of every entry of the cluster.
func (m *memStore) instanceNodes() []string {
	all, err := m.reader().ReadPrefix(context.Background(), "")
	if err != nil {
		panic(err)
	}
	var out []string
	for _, r := range all {
		out = append(out, r.Node)
	}
	return out
}

func memOf(s Store) *memStore {
	switch s := s.(type) {
	case *memStore:
		return s
	case *failingStore:
		return s.memStore
	case *watchStore:
		return s.memStore
	case *witnessStore:
		return s.memStore
	case *panickyRead:
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
	return startOptions(t, w, store, nil, edit)
}

// startOptions is startWith with options edited before New.
func startOptions(t *testing.T, w *fakeWatcher, store Store, opts func(*Options), edit func(*Supervisor)) *fixture {
	t.Helper()
	cluster, err := ownership.New("test")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{
		Selector: Selector{Allow: []string{"*"}, Deny: []string{"kube-system"}},
		Worker:   worker.Config{Cluster: cluster, DefaultWindow: 0, Terminating: worker.TerminatingWarning},
		Watcher:  w, Store: store,
	}
	if opts != nil {
		opts(&o)
	}
	sup := New(o)
	if edit != nil {
		edit(sup)
	}
	memOf(store).bind(sup.opts.Worker.Cluster, sup.opts.Clock)
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{w: w, store: memOf(store), sup: sup, cluster: sup.opts.Worker.Cluster, cancel: cancel, done: make(chan error, 1)}
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
	store.put(gone, cluster.NodeName())
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
	reads := make(chan struct{}, 1)
	store.twin.SetFault(func(*http.Request) error {
		select {
		case reads <- struct{}{}:
		default:
		}
		return errRefused
	})
	w.services[k8s.Key{Namespace: "ns", Name: "a"}] = service("ns", "a", "10.0.0.1")
	close(w.synced)
	f := start(t, w, store)
	<-reads // the bootstrap read, failed
	<-reads // and its retry
	// While Consul cannot be read, nothing is written and the fleet is not ready.
	if f.sup.Bootstrapped() || store.applies != 0 {
		t.Fatalf("bootstrapped=%v applies=%d with Consul unreachable", f.sup.Bootstrapped(), store.applies)
	}
	store.down(false)
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
		// The loop guard: a Service made from Consul never goes back,
		// even opted in.
		{"marked by to-k8s", func() *k8s.Service {
			x := service("ns", "f")
			x.Object = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{k8smark.LabelManagedBy: k8smark.ManagedBy, k8smark.LabelCluster: "other"}}}
			return x
		}(), false},
		{"import mode", func() *k8s.Service {
			x := service("ns", "g")
			x.Annotations = map[string]string{worker.AnnotationSync: "true", k8smark.AnnotationConsulService: "db"}
			x.Object = &corev1.Service{}
			return x
		}(), false},
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
