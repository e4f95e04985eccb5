package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/k8stest"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor/loss"
	"github.com/fleetsync/fleetsync/worker"
)

// watchStore signals every node read of the supervisor's check.
type watchStore struct {
	*memStore
	nodeReads chan struct{}
	kvReads   chan struct{} // nil: not signalled
	// marks: the catalog's marks are answered (else unknown, so that
	// every check reads the nodes, as the tests of what a check finds
	// expect); marksReads signals each read of them.
	marks      bool
	marksReads chan struct{}
	// stale, when set, is a shared read of the marks begun at staleAt:
	// answered to a caller that accepts a read that old.
	stale   *consul.CatalogMarks
	staleAt time.Time
	flaky   atomic.Bool // node index and witness reads fail
}

func (s *watchStore) NodeIndex(ctx context.Context, node string) (uint64, error) {
	if s.flaky.Load() {
		return 0, errors.New("Unexpected response code: 500 (rpc error: timeout)")
	}
	return s.memStore.NodeIndex(ctx, node)
}

func (s *watchStore) ReadWitness(ctx context.Context, w consul.Witness) (consul.WitnessRead, error) {
	if s.flaky.Load() {
		return consul.WitnessRead{}, errors.New("Unexpected response code: 500 (rpc error: timeout)")
	}
	return s.memStore.ReadWitness(ctx, w)
}

func newWatchStore() *watchStore {
	return &watchStore{memStore: newMemStore(), nodeReads: make(chan struct{}, 1), marksReads: make(chan struct{}, 1)}
}

func (s *watchStore) CatalogMarks(ctx context.Context, after time.Time) (consul.CatalogMarks, error) {
	m, err := s.memStore.CatalogMarks(ctx, after)
	select {
	case s.marksReads <- struct{}{}:
	default:
	}
	if !s.marks {
		return consul.CatalogMarks{}, err
	}
	if s.stale != nil && !s.staleAt.Before(after) {
		return *s.stale, nil
	}
	return m, err
}

// KVIndex signals every read of the KV index.
func (s *watchStore) KVIndex(ctx context.Context, key string) (uint64, error) {
	i, err := s.memStore.KVIndex(ctx, key)
	if s.kvReads != nil {
		s.kvReads <- struct{}{}
	}
	return i, err
}

func (s *watchStore) ReadNodes(ctx context.Context) (consul.NodesView, error) {
	v, err := s.memStore.ReadNodes(ctx)
	select {
	case s.nodeReads <- struct{}{}:
	default:
	}
	return v, err
}

// awaitNodeRead waits for the watch's next node read.
func awaitNodeRead(t *testing.T, reads <-chan struct{}) {
	t.Helper()
	select {
	case <-reads:
	case <-time.After(10 * time.Second): // failsafe, never reached when right
		t.Fatal("the watch did not read the nodes")
	}
}

// stepToNextCheck waits for the check's timer, moves the clock one second
// and waits for the node read it makes.
func stepToNextCheck(t *testing.T, f *fixture, clk *clocktesting.FakeClock, reads <-chan struct{}) {
	t.Helper()
	f.waitFor(t, "the check's timer", clk.HasWaiters)
	clk.Step(time.Second)
	awaitNodeRead(t, reads)
}

type lossHooks struct {
	nopHooks
	mu      sync.Mutex
	signals []string
	foreign int
}

func (h *lossHooks) ConsulDataLost(s string) {
	h.mu.Lock()
	h.signals = append(h.signals, s)
	h.mu.Unlock()
}
func (h *lossHooks) ForeignNodes(n int) { h.mu.Lock(); h.foreign = n; h.mu.Unlock() }
func (h *lossHooks) got() ([]string, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.signals), h.foreign
}

// TestLossMakesEveryWorkerRepair: a node created again, and a worker's
// evidence, each make every worker re-read its Service at once; a
// look-alike node is a readiness problem while it exists.
func TestLossMakesEveryWorkerRepair(t *testing.T) {
	w := syncedFleet(3)
	clk := clocktesting.NewFakeClock(time.Now())
	store := newWatchStore()
	hooks := &lossHooks{}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval, s.opts.Hooks.Consul = clk, time.Second, hooks
		s.opts.Worker.Cluster, _ = s.opts.Worker.Cluster.WithNodes(4)
	})
	f.waitFor(t, "3 instances", func() bool { return f.store.count("") == 3 })
	nodeRead := func() { t.Helper(); awaitNodeRead(t, store.nodeReads) }
	check := func() { t.Helper(); stepToNextCheck(t, f, clk, store.nodeReads) } // one check: the watch reads the nodes
	nodeRead()                                                                  // the first check, at bootstrap
	other := store.other
	ourNode := func(name string) {
		t.Helper()
		n := f.cluster.NodeNamed(name)
		if _, err := other.Catalog().Register(&api.CatalogRegistration{Node: n.Name, Address: n.Address, NodeMeta: n.Meta}, nil); err != nil {
			t.Fatal(err)
		}
	}

	check() // the check sees our nodes

	// Consul restarted empty; after its own first writes, writes of ours
	// re-created our nodes.
	nodes := slices.Compact(slices.Sorted(slices.Values(f.store.instanceNodes())))
	store.twin.Wipe()
	if _, err := other.KV().Put(&api.KVPair{Key: "consul/first-write", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		ourNode(n)
	}
	check()
	f.waitFor(t, "every worker re-read", func() bool { return f.store.count("") == 3 })
	// The check before may still be reading node indexes or witnesses
	// when the twin is wiped (awaitNodeRead returns at its node read):
	// then an index gone back or an entry lost comes first, as true a
	// sign of the same loss. TestLossDetector pins each signal.
	if sig, _ := hooks.got(); len(sig) == 0 || !slices.Contains([]string{loss.SignalNodeRecreated, loss.SignalIndexBack, loss.SignalEntryLost}, sig[0]) {
		t.Fatalf("signals %v, want %s, %s or %s first", sig, loss.SignalNodeRecreated, loss.SignalIndexBack, loss.SignalEntryLost)
	}

	f.store.loseOne()
	f.sup.lossSeen(k8s.Key{Namespace: "ns", Name: "s0"}, "service ns/s0: 1 of 1 entries gone")
	f.waitFor(t, "every worker re-read after a worker's evidence", func() bool { return f.store.count("") == 3 })
	f.waitFor(t, "the evidence counted", func() bool { sig, _ := hooks.got(); return slices.Contains(sig, loss.SignalWorker) })

	// Someone else's node under the name of one of ours that holds none
	// of our instances.
	used := map[string]bool{}
	for _, in := range f.store.instanceNodes() {
		used[in] = true
	}
	lookAlike := ""
	for i := 1; i < 4 && lookAlike == ""; i++ {
		if name := fmt.Sprintf("k8s-test.%d", i); !used[name] {
			lookAlike = name
		}
	}
	if lookAlike == "" {
		t.Fatalf("no node free of instances among %v", used)
	}
	foreign := func(name, addr string) {
		t.Helper()
		if _, err := other.Catalog().Register(&api.CatalogRegistration{Node: name, Address: addr, NodeMeta: map[string]string{"team": "x"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(name string) {
		t.Helper()
		if _, err := other.Catalog().Deregister(&api.CatalogDeregistration{Node: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	foreign(lookAlike, "10.9.9.9")
	check()
	f.waitFor(t, "the look-alike node reported", func() bool { return len(f.sup.Problems()) == 1 })
	if p := f.sup.Problems()[0]; !strings.Contains(p, lookAlike) || !strings.Contains(p, "10.9.9.9") {
		t.Fatalf("problem %q does not name the node and its address", p)
	}
	if _, n := hooks.got(); n != 1 {
		t.Fatalf("foreign nodes gauge %d, want 1", n)
	}
	gone(lookAlike)
	check()
	f.waitFor(t, "the problem cleared", func() bool { return len(f.sup.Problems()) == 0 })

	// A look-alike beyond the nodes in use blocks nothing: counted, not a
	// readiness problem.
	foreign("k8s-test.7", "10.9.9.7")
	check()
	f.waitFor(t, "the unused look-alike counted", func() bool { _, n := hooks.got(); return n == 1 })
	if p := f.sup.Problems(); len(p) != 0 {
		t.Fatalf("a look-alike node no Service is placed on fails readiness: %v", p)
	}
}

// TestServiceAddedWhileBootstrapListsIsSynced: with informer resync off, a
// Service created while bootstrap lists the cache is not dropped.
func TestServiceAddedWhileBootstrapListsIsSynced(t *testing.T) {
	w := k8stest.New()
	w.Set(service("ns", "old", "10.2.0.99"))
	w.Synced()
	// A Service is created right after every listing of the cache: the
	// last one lands after bootstrap took its list and before it ends.
	var mu sync.Mutex
	var added []k8s.Key
	w.OnKeys(func() {
		mu.Lock()
		key := k8s.Key{Namespace: "ns", Name: fmt.Sprintf("new-%d", len(added))}
		added = append(added, key)
		n := len(added)
		mu.Unlock()
		go w.Set(service(key.Namespace, key.Name, fmt.Sprintf("10.2.0.%d", n))) // the informer's goroutine
	})
	store := newMemStore()
	cluster, _ := ownership.New("test")
	sup := New(Options{
		Selector: Selector{Allow: []string{"*"}},
		Worker:   worker.Config{Cluster: cluster, Terminating: worker.TerminatingWarning},
		Watcher:  w, Store: store,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	defer func() { cancel(); <-done }()
	f := &fixture{store: store}
	f.waitFor(t, "bootstrap", sup.Bootstrapped)
	mu.Lock()
	keys := slices.Clone(added)
	mu.Unlock()
	for _, key := range keys {
		f.waitFor(t, "Service "+key.String()+" synced", func() bool { return store.count(cluster.IDPrefix(key.Namespace, key.Name)) == 1 })
	}
}

// TestConsulBackEndsBackoffs: when the node check gets an answer again
// after it got none, every worker whose flush failed meanwhile retries at
// once, well before its backoff ends (found by the soak: changes made
// while a Consul server was down waited out backoffs of up to 30s after
// it came back).
func TestConsulBackEndsBackoffs(t *testing.T) {
	w, key := syncedWatcher("web", "10.1.0.1")
	clk := clocktesting.NewFakeClock(time.Now())
	store := newWatchStore()
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval = clk, 10*time.Millisecond
	})
	f.waitFor(t, "1 instance", func() bool { return f.store.count("") == 1 })
	<-store.nodeReads // the first check, at bootstrap
	// The fake clock moves in 10ms steps, 150ms at most in all: the
	// worker's backoff (160-240ms after its first failure) never ends by
	// itself here, while every step can end the check's 10ms wait.
	steps := 0
	nextCheck := func() {
		t.Helper()
		for ; steps < 15; steps++ {
			clk.Step(10 * time.Millisecond)
			select {
			case <-store.nodeReads:
				steps++
				return
			case <-time.After(200 * time.Millisecond): // the check's timer was not armed yet: step again
			}
		}
		t.Fatal("the node check did not run within 150ms of fake time")
	}
	store.down(true)
	before := store.appliesN()
	w.set(key, service("ns", "web", "10.1.0.1", "10.1.0.2"))
	f.waitFor(t, "the flush tried and failed", func() bool { return store.appliesN() > before })
	nextCheck() // no answer
	store.down(false)
	nextCheck() // an answer: the workers retry
	f.waitFor(t, "the change landed before the backoff ended", func() bool { return f.store.count("") == 2 })
}

// TestKVIndexGoingBackIsLoss: a snapshot restore in a busy Consul can
// leave our nodes' indexes above what was read before (catalog writes
// right after the restore raise them), but the KV index, which moves only
// with KV writes, shows it: every worker re-reads (found by the soak: on a
// busy 3-server cluster a restore left stale and missing instances until
// the anti-entropy pass).
func TestKVIndexGoingBackIsLoss(t *testing.T) {
	w := syncedFleet(3)
	clk := clocktesting.NewFakeClock(time.Now())
	store := newWatchStore()
	store.kvReads = make(chan struct{}, 10)
	hooks := &lossHooks{}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval, s.opts.Hooks.Consul, s.opts.StateKey = clk, time.Second, hooks, "fleetsync/clusters/test.index-probe"
	})
	f.waitFor(t, "3 instances", func() bool { return f.store.count("") == 3 })
	// A check, to its end (its next timer armed): the witness reads come
	// after the KV read, and must not see the faults injected next.
	check := func() {
		t.Helper()
		stepToNextCheck(t, f, clk, store.nodeReads)
		<-store.kvReads
		f.waitFor(t, "the check's end", clk.HasWaiters)
	}
	<-store.nodeReads // the first check, at bootstrap
	<-store.kvReads
	snap := store.twin.Snapshot()
	if _, err := store.other.KV().Put(&api.KVPair{Key: "app/config", Value: []byte("v2")}, nil); err != nil {
		t.Fatal(err)
	}
	check() // the KV index moved on: nothing
	store.twin.Restore(snap)
	f.store.loseOne() // a catalog write after the restore raises the node's index past its old value
	check()
	f.waitFor(t, "every worker re-read", func() bool { return f.store.count("") == 3 })
	if sig, _ := hooks.got(); !slices.Equal(sig, []string{loss.SignalIndexBack}) {
		t.Fatalf("signals %v, want [%s]", sig, loss.SignalIndexBack)
	}
}

// witnessStore is a watchStore whose witnesses (the client's record of
// its committed writes, kept by the real time) the test scripts, with
// entries that read as set: at an index, or gone.
type witnessStore struct {
	*watchStore
	wmu     sync.Mutex
	ws      []consul.Witness
	entries map[string]uint64 // by ID; absent: gone
	theirs  map[string]bool   // entries someone else re-registered (no mark)
	retired map[string]bool
	calls   chan struct{} // signalled by Witnesses; nil: not
	wreads  []string
	forgot  []string // ForgetWitnesses calls
}

func (s *witnessStore) Witnesses() []consul.Witness {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.calls != nil {
		select {
		case s.calls <- struct{}{}:
		default:
		}
	}
	return slices.Clone(s.ws)
}

// ResetCommitted forgets the witnesses too, as the real client does.
func (s *witnessStore) ResetCommitted() {
	s.watchStore.ResetCommitted()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.ws = nil
}

func (s *witnessStore) IsWitness(w consul.Witness) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return slices.Contains(s.ws, w) && !s.retired[w.ID]
}

func (s *witnessStore) ForgetWitnesses(prefix string) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.forgot = append(s.forgot, prefix)
}

func (s *witnessStore) ReadWitness(_ context.Context, w consul.Witness) (consul.WitnessRead, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wreads = append(s.wreads, w.ID)
	i, ok := s.entries[w.ID]
	return consul.WitnessRead{Found: ok, Index: i, Ours: ok && !s.theirs[w.ID]}, nil
}

func (s *witnessStore) edit(f func(s *witnessStore)) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	f(s)
}

// TestWitnessLostIsLoss: an entry of a committed write gone, or at an
// older index, makes every worker re-read, even when writes after the
// restore made newer witnesses that are fine (found by the soak: catalog
// writes right after a restore hid it from the node indexes); an entry
// gone because our own delete of it just committed is not a loss; an
// idle fleet's old witnesses are not read.
func TestWitnessLostIsLoss(t *testing.T) {
	w := syncedFleet(3)
	start := time.Now()
	clk := clocktesting.NewFakeClock(start)
	wit := func(id string, idx uint64, age time.Duration) consul.Witness {
		return consul.Witness{Node: "k8s-test", ID: id, Name: "s0", Index: idx, At: start.Add(-age)}
	}
	// Written 30s, 10s, 3s ago and just now; all there.
	store := &witnessStore{watchStore: newWatchStore(),
		ws:      []consul.Witness{wit("a", 10, 30*time.Second), wit("b", 20, 10*time.Second), wit("c", 30, 3*time.Second), wit("d", 40, 0)},
		entries: map[string]uint64{"a": 10, "b": 20, "c": 30, "d": 40}, retired: map[string]bool{}}
	hooks := &lossHooks{}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval, s.opts.Hooks.Consul = clk, time.Second, hooks
	})
	f.waitFor(t, "3 instances", func() bool { return f.store.count("") == 3 })
	check := func() { t.Helper(); stepToNextCheck(t, f, clk, store.nodeReads) }
	<-store.nodeReads // the first check, at bootstrap
	check()
	// Our own delete of c committed while it was read: not a loss.
	store.edit(func(s *witnessStore) { delete(s.entries, "c"); s.retired["c"] = true })
	check()
	check() // one more, so that the one before has finished
	if sig, _ := hooks.got(); len(sig) != 0 {
		t.Fatalf("signals %v with every witness standing or retired by us", sig)
	}
	// A restore of a snapshot 12s old took b back in time and undid d; a
	// write after it (e) is the newest witness and is there.
	f.store.loseOne() // what the loss took: repaired once it is seen
	store.edit(func(s *witnessStore) {
		s.entries["b"] = 12
		delete(s.entries, "d")
		s.ws = append(s.ws, consul.Witness{Node: "k8s-test", ID: "e", Name: "s0", Index: 50, At: clk.Now()})
		s.entries["e"] = 50
	})
	check()
	f.waitFor(t, "every worker re-read", func() bool { return f.store.count("") == 3 })
	if sig, _ := hooks.got(); !slices.Equal(sig, []string{loss.SignalEntryLost}) {
		t.Fatalf("signals %v, want [%s]", sig, loss.SignalEntryLost)
	}
	// The loss made the witnesses history; a write after it is one.
	// Idle for longer than loss.MaxWitnessAge: nothing is read any more.
	store.edit(func(s *witnessStore) {
		if len(s.ws) != 0 {
			t.Errorf("witnesses %v still stand after the loss", s.ws)
		}
		s.ws = []consul.Witness{{Node: "k8s-test", ID: "f", Name: "s0", Index: 60, At: clk.Now()}}
		s.entries["f"] = 60
	})
	clk.Step(loss.MaxWitnessAge)
	check()
	store.edit(func(s *witnessStore) { s.wreads = nil })
	check()
	check()
	store.edit(func(s *witnessStore) {
		if len(s.wreads) != 0 {
			t.Errorf("an idle fleet read witnesses %v", s.wreads)
		}
	})
}

// TestWitnessBackFromBeforeOurDeleteIsLoss: the whole check, on a running
// fleet: our deleted entry back at an index below the one the delete
// committed after makes every worker re-read; someone else's entry under
// a written ID does not.
func TestWitnessBackFromBeforeOurDeleteIsLoss(t *testing.T) {
	w := syncedFleet(3)
	clk := clocktesting.NewFakeClock(time.Now())
	ws := []consul.Witness{{Node: "k8s-test", ID: "a", Name: "s0", Index: 40, At: clk.Now()},
		{Node: "k8s-test", ID: "z", Name: "s0", Index: 41, Deleted: true, At: clk.Now()}}
	store := &witnessStore{watchStore: newWatchStore(), ws: ws, entries: map[string]uint64{"a": 40}, retired: map[string]bool{}}
	hooks := &lossHooks{}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval, s.opts.Hooks.Consul = clk, time.Second, hooks
	})
	f.waitFor(t, "3 instances", func() bool { return f.store.count("") == 3 })
	check := func() { t.Helper(); stepToNextCheck(t, f, clk, store.nodeReads) }
	<-store.nodeReads
	check()
	store.edit(func(s *witnessStore) {
		s.entries["a"] = 55
		s.theirs = map[string]bool{"a": true}
	})
	check()
	check()
	if sig, _ := hooks.got(); len(sig) != 0 {
		t.Fatalf("signals %v with our witnesses as left and someone else's entry under a", sig)
	}
	f.store.loseOne()
	store.edit(func(s *witnessStore) { s.entries["z"] = 30 })
	check()
	f.waitFor(t, "every worker re-read", func() bool { return f.store.count("") == 3 })
	if sig, _ := hooks.got(); !slices.Equal(sig, []string{loss.SignalEntryLost}) {
		t.Fatalf("signals %v, want [%s]", sig, loss.SignalEntryLost)
	}
}

// TestLossRepairsFromOneReadOfEveryNode: after a loss the fleet is
// repaired from one read of the cluster's nodes: a Service deleted since
// (no worker) whose entries a restore brought back gets a worker that
// deletes them; an entry brought back under a Consul name the Service no
// longer has (not in a read by name) is deleted; an entry lost is written
// again (found by the soak: stale instances stayed after restores).
func TestLossRepairsFromOneReadOfEveryNode(t *testing.T) {
	w, _ := syncedWatcher("web", "10.1.0.1", "10.1.0.2")
	store := newWatchStore()
	clk := clocktesting.NewFakeClock(time.Now())
	f := startWith(t, w, store, func(s *Supervisor) { s.opts.Clock, s.opts.NodeCheckInterval = clk, time.Second })
	f.waitFor(t, "2 instances", func() bool { return f.store.count("") == 2 })
	// The restore: one of web's lost, one of web under its old Consul
	// name and two of a Service deleted since are back.
	f.store.loseOne()
	old := f.cluster.Stamp(consul.Instance{ID: f.cluster.InstanceID("ns", "web", "10.1.0.9", 8080), Name: "web-old", Address: "10.1.0.9", Port: 8080,
		Meta: map[string]string{worker.MetaNamespace: "ns", worker.MetaService: "web"}})
	gone1 := f.cluster.Stamp(consul.Instance{ID: f.cluster.InstanceID("ns", "gone", "10.2.0.1", 8080), Name: "gone", Address: "10.2.0.1", Port: 8080,
		Meta: map[string]string{worker.MetaNamespace: "ns", worker.MetaService: "gone"}})
	gone2 := gone1
	gone2.ID, gone2.Address = f.cluster.InstanceID("ns", "gone", "10.2.0.2", 8080), "10.2.0.2"
	for _, in := range []consul.Instance{old, gone1, gone2} {
		f.store.put(in, "k8s-test")
	}
	f.sup.lossSeen(k8s.Key{Namespace: "ns", Name: "web"}, "service ns/web: 1 of 2 entries gone")
	f.waitFor(t, "web's two instances, nothing else", func() bool {
		return f.store.count("") == 2 && f.store.count(f.cluster.IDPrefix("ns", "web")) == 2 && f.store.count(old.ID) == 0
	})
}

// TestWritesBeforeAnOutageAreChecked: the witnesses standing when Consul
// stopped answering are checked once it answers again, so a crash that
// lost the last writes is seen even when a write after it is the newest
// witness and is there (the soak: a kill -9 of every server lost the last
// writes and the loss went unseen for 45s).
func TestWritesBeforeAnOutageAreChecked(t *testing.T) {
	w, _ := syncedWatcher("s0", "10.1.0.1")
	clk := clocktesting.NewFakeClock(time.Now())
	store := &witnessStore{watchStore: newWatchStore(), entries: map[string]uint64{}, retired: map[string]bool{}, calls: make(chan struct{}, 1)}
	hooks := &lossHooks{}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval, s.opts.Hooks.Consul = clk, time.Second, hooks
	})
	f.waitFor(t, "1 instance", func() bool { return f.store.count("") == 1 })
	check := func() { t.Helper(); stepToNextCheck(t, f, clk, store.nodeReads) }
	<-store.nodeReads // the first check, at bootstrap
	<-store.calls     // which read the witnesses
	x := consul.Witness{Node: "k8s-test", ID: "x", Name: "s0", Index: 70, At: clk.Now().Add(2 * time.Second)}
	store.edit(func(s *witnessStore) { s.ws, s.entries["x"] = []consul.Witness{x}, 70 })
	store.down(true)
	check()       // no answer
	<-store.calls // the check took the witnesses standing
	y := consul.Witness{Node: "k8s-test", ID: "y", Name: "s0", Index: 90, At: clk.Now().Add(3 * time.Second)}
	store.edit(func(s *witnessStore) {
		delete(s.entries, "x") // lost by the crash
		s.ws, s.entries["y"] = []consul.Witness{x, y}, 90
	})
	store.down(false)
	check()
	f.waitFor(t, "the loss seen", func() bool { sig, _ := hooks.got(); return slices.Contains(sig, loss.SignalEntryLost) })
	if sig, _ := hooks.got(); !slices.Equal(sig, []string{loss.SignalEntryLost}) {
		t.Fatalf("signals %v, want [%s]", sig, loss.SignalEntryLost)
	}
}

// TestHandedOverWorkerWitnessesNothing: a worker whose shard goes to
// another replica retires its Service's witnesses, which that replica may
// now rewrite or delete (the reviewer's finding: a replica that took a
// Service over deleting an instance looked like a loss to the one that
// wrote it), and it has done so when LoseShard returns. (A guard: the
// forgetting moved from the worker's end to stopped.)
func TestHandedOverWorkerWitnessesNothing(t *testing.T) {
	w, key := syncedWatcher("s0", "10.1.0.1")
	store := newMemStore()
	f, ctx := startSharded(t, w, store, "test", 1)
	f.sup.GainShard(ctx, 0)
	prefix := f.cluster.IDPrefix(key.Namespace, key.Name)
	// The witness is recorded once the answer is in, after the entry.
	f.waitFor(t, "the write's witness", func() bool { return witnessesOf(store, prefix, false) == 1 })
	f.sup.LoseShard(0)
	if n := witnessesOf(store, prefix, false); n != 0 {
		t.Fatalf("%d witnesses stand after the shard was handed over, want 0", n)
	}
}

// TestFinishedWorkerKeepsItsDeleteWitnesses: a worker whose Service is
// gone deletes its instances and ends; those deletes stay witnesses after
// it ended. A restore of a snapshot taken before them brings the entries
// back with no worker left to see it, and a write right after the restore
// hides it from the node indexes: the witness is then the only evidence
// (TestRestoreAfterAServiceWentRepairs, real Consul). Before, the ended
// worker retired them too.
func TestFinishedWorkerKeepsItsDeleteWitnesses(t *testing.T) {
	w, key := syncedWatcher("s0", "10.1.0.1")
	store := newMemStore()
	f := startWith(t, w, store, nil)
	prefix := f.cluster.IDPrefix(key.Namespace, key.Name)
	f.waitFor(t, "1 instance", func() bool { return store.count(prefix) == 1 })
	w.set(key, nil)
	f.waitFor(t, "the instance deleted and the worker ended", func() bool {
		return store.count(prefix) == 0 && f.sup.Len() == 0
	})
	f.stop() // every worker goroutine has returned
	if n := witnessesOf(store, prefix, true); n != 1 {
		t.Fatalf("%d witnesses of the delete after the worker ended, want 1", n)
	}
}

// hasWitness reports whether a standing witness's ID holds part (a write's
// witness is recorded once its answer is in, after the entry is in the
// catalog).
func hasWitness(store *memStore, part string) bool {
	return slices.ContainsFunc(store.Witnesses(), func(w consul.Witness) bool { return strings.Contains(w.ID, part) })
}

// witnessesOf counts the standing witnesses of entries under prefix that
// are deletes (deleted) or writes.
func witnessesOf(store *memStore, prefix string, deleted bool) int {
	n := 0
	for _, w := range store.Witnesses() {
		if strings.HasPrefix(w.ID, prefix) && w.Deleted == deleted {
			n++
		}
	}
	return n
}

// syncedWatcher is a synced fake watcher holding Service ns/name with ips.
func syncedWatcher(name string, ips ...string) (*fakeWatcher, k8s.Key) {
	w := newFakeWatcher()
	key := k8s.Key{Namespace: "ns", Name: name}
	w.services[key] = service("ns", name, ips...)
	close(w.synced)
	return w, key
}

// syncedFleet is a synced fake watcher holding Services ns/s0 .. ns/s<n-1>,
// one endpoint each (10.1.<i>.1).
func syncedFleet(n int) *fakeWatcher {
	w := newFakeWatcher()
	for i := range n {
		k := k8s.Key{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}
		w.services[k] = service("ns", k.Name, fmt.Sprintf("10.1.%d.1", i))
	}
	close(w.synced)
	return w
}

// TestQuietCatalogCostsTheCheckNoRead: while the catalog's marks stand
// where a check that found nothing left them and no write of ours
// committed since, a check reads neither the nodes nor their indexes; a
// write of ours undone by a snapshot restore (the marks then back where
// they were), or Consul restarting empty, makes the next check read, and
// it finds the loss.
func TestQuietCatalogCostsTheCheckNoRead(t *testing.T) {
	w := syncedFleet(3)
	clk := clocktesting.NewFakeClock(time.Now())
	store := newWatchStore()
	store.marks = true
	hooks := &lossHooks{}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval, s.opts.Hooks.Consul = clk, time.Second, hooks
	})
	f.waitFor(t, "3 instances", func() bool { return f.store.count("") == 3 })
	awaitNodeRead(t, store.nodeReads) // the first check, at bootstrap: marks not known yet
	// check runs one check and reports whether it read the nodes.
	check := func() bool {
		t.Helper()
		f.waitFor(t, "the check's timer", clk.HasWaiters)
		clk.Step(time.Second)
		awaitNodeRead(t, store.marksReads)
		f.waitFor(t, "the check's next timer", clk.HasWaiters)
		select {
		case <-store.nodeReads:
			return true
		default:
			return false
		}
	}
	// The workers' first writes may land after the first check's marks:
	// the check after them reads, and records where they stand.
	settled := false
	for range 3 {
		if settled = !check(); settled {
			break
		}
	}
	if !settled {
		t.Fatal("every check read the nodes over a quiet catalog")
	}
	// A read comes after the check's marks read: one that came late is
	// seen by the next check's look.
	for i := range 4 {
		if check() {
			t.Fatalf("quiet check %d (or the one before) read the nodes", i+1)
		}
	}
	// A snapshot, a write of ours, and a restore of the snapshot before
	// the next check: the marks are back where that check saw them, but
	// our write is undone; the check reads, and finds it.
	snap := store.twin.Snapshot()
	key := k8s.Key{Namespace: "ns", Name: "s0"}
	prefix := f.cluster.IDPrefix(key.Namespace, key.Name)
	w.set(key, service("ns", "s0", "10.1.0.1", "10.1.0.9"))
	f.waitFor(t, "the write of s0, and its answer in", func() bool { return f.store.count(prefix) == 2 && hasWitness(f.store, "_10.1.0.9_") })
	store.twin.Restore(snap)
	stepToNextCheck(t, f, clk, store.nodeReads)
	f.waitFor(t, "the restore found", func() bool { got, _ := hooks.got(); return len(got) > 0 })
	f.waitFor(t, "s0 repaired", func() bool { return f.store.count(prefix) == 2 })
	settled = false
	for range 3 {
		if settled = !check(); settled {
			break
		}
	}
	if !settled {
		t.Fatal("every check read the nodes after the repair")
	}
	n0, _ := hooks.got()

	node := f.store.instanceNodes()[0]
	store.twin.Wipe()
	n := f.cluster.NodeNamed(node)
	if _, err := store.other.Catalog().Register(&api.CatalogRegistration{Node: n.Name, Address: n.Address, NodeMeta: n.Meta}, nil); err != nil {
		t.Fatal(err)
	}
	stepToNextCheck(t, f, clk, store.nodeReads)
	f.waitFor(t, "the loss found", func() bool { got, _ := hooks.got(); return len(got) > len(n0) })
	if got, _ := hooks.got(); got[len(n0)] != loss.SignalNodeRecreated && got[len(n0)] != loss.SignalIndexBack {
		t.Errorf("signals %v, want %s or %s after %v", got, loss.SignalNodeRecreated, loss.SignalIndexBack, n0)
	}
}

// quietChecks is a fixture for the tests of the node check over a quiet
// catalog: the fleet of 3, synced, the marks answered.
type quietChecks struct {
	t     *testing.T
	f     *fixture
	w     *fakeWatcher
	store *watchStore
	clk   *clocktesting.FakeClock
	hooks *lossHooks
}

func newQuietChecks(t *testing.T) *quietChecks {
	q := &quietChecks{t: t, w: syncedFleet(3), clk: clocktesting.NewFakeClock(time.Now()), store: newWatchStore(), hooks: &lossHooks{}}
	q.store.marks = true
	q.f = startWith(t, q.w, q.store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval, s.opts.Hooks.Consul = q.clk, time.Second, q.hooks
	})
	q.f.waitFor(t, "3 instances", func() bool { return q.f.store.count("") == 3 })
	awaitNodeRead(t, q.store.nodeReads) // the first check, at bootstrap
	for range 5 {
		if !q.check() {
			return q
		}
	}
	t.Fatal("every check read the nodes over a quiet catalog")
	return nil
}

// check runs one check and reports whether it read the nodes.
func (q *quietChecks) check() bool {
	q.t.Helper()
	q.f.waitFor(q.t, "the check's timer", q.clk.HasWaiters)
	q.clk.Step(time.Second)
	awaitNodeRead(q.t, q.store.marksReads)
	q.f.waitFor(q.t, "the check's next timer", q.clk.HasWaiters)
	select {
	case <-q.store.nodeReads:
		return true
	default:
		return false
	}
}

// write changes s0 (one instance more) and waits for it in Consul.
func (q *quietChecks) write() string {
	key := k8s.Key{Namespace: "ns", Name: "s0"}
	prefix := q.f.cluster.IDPrefix(key.Namespace, key.Name)
	q.w.set(key, service("ns", "s0", "10.1.0.1", "10.1.0.9"))
	// The answer in too (its witness recorded): a check before that takes
	// the catalog for unchanged, and the one after it reads.
	q.f.waitFor(q.t, "the write of s0, and its answer in", func() bool {
		return q.f.store.count(prefix) == 2 && hasWitness(q.f.store, "_10.1.0.9_")
	})
	return prefix
}

// TestStaleSharedMarksDoNotHideARestore (found by review): the marks a
// worker's pass shared were read just before our write; a check must not
// take them for the catalog after it, or a restore of a snapshot taken
// before the write (which brings back exactly those marks) goes unseen.
func TestStaleSharedMarksDoNotHideARestore(t *testing.T) {
	q := newQuietChecks(t)
	snap := q.store.twin.Snapshot()
	pre, err := q.store.memStore.CatalogMarks(t.Context(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	q.store.stale, q.store.staleAt = &pre, q.clk.Now()
	prefix := q.write()
	if !q.check() {
		t.Fatal("the check after our write did not read")
	}
	q.store.stale = nil
	q.store.twin.Restore(snap)
	q.check()
	q.f.waitFor(t, "the restore found", func() bool { got, _ := q.hooks.got(); return len(got) > 0 })
	q.f.waitFor(t, "s0 repaired", func() bool { return q.f.store.count(prefix) == 2 })
}

// TestACheckWithoutAnswersSettlesNothing (found by review): a check in
// which reads got no answer found nothing, but proves nothing: the next
// ones still read, and find the restore it missed.
func TestACheckWithoutAnswersSettlesNothing(t *testing.T) {
	q := newQuietChecks(t)
	snap := q.store.twin.Snapshot()
	prefix := q.write()
	for range 3 {
		if !q.check() {
			break
		}
	}
	q.store.twin.Restore(snap)
	q.store.flaky.Store(true)
	q.check()
	if got, _ := q.hooks.got(); len(got) != 0 {
		t.Fatalf("signals %v from a check whose reads failed", got)
	}
	q.store.flaky.Store(false)
	if !q.check() {
		t.Fatal("the check after one without answers read nothing")
	}
	q.f.waitFor(t, "the restore found", func() bool { got, _ := q.hooks.got(); return len(got) > 0 })
	q.f.waitFor(t, "s0 repaired", func() bool { return q.f.store.count(prefix) == 2 })
}

// TestDeleteUndoneByARestoreIsSeen (the review's finding): a quiet
// fleet's check settled on the catalog's marks; a snapshot is taken, a
// Service is deleted (its worker deletes its instance and ends), and the
// snapshot is restored: the marks are back to those of the settled
// check, and a delete moves no committed index, so every later check
// skipped on them and the instance stayed for good. Now a witness from
// after the last complete check forbids the skip, and the delete's
// witness sits above the entry's own index even when the entry was our
// latest write.
func TestDeleteUndoneByARestoreIsSeen(t *testing.T) {
	for _, name := range []string{"s0", "s1", "s2"} { // one of them was the latest write
		t.Run(name, func(t *testing.T) {
			q := newQuietChecks(t)
			snap := q.store.twin.Snapshot()
			key := k8s.Key{Namespace: "ns", Name: name}
			prefix := q.f.cluster.IDPrefix(key.Namespace, key.Name)
			q.w.set(key, nil)
			q.f.waitFor(t, "deleted, its worker ended", func() bool { return q.f.store.count(prefix) == 0 && q.f.sup.Len() == 2 })
			q.store.twin.Restore(snap)
			if q.f.store.count(prefix) != 1 {
				t.Fatal("the restore did not bring the instance back")
			}
			if !q.check() {
				t.Fatal("the check after the restore skipped on the marks")
			}
			q.f.waitFor(t, "the instance deleted again", func() bool { return q.f.store.count(prefix) == 0 })
			if sig, _ := q.hooks.got(); !slices.Equal(sig, []string{loss.SignalEntryLost}) {
				t.Fatalf("signals %v, want [%s]", sig, loss.SignalEntryLost)
			}
		})
	}
}

// TestReadinessChangeUndoneByARestoreIsSeen (the review's finding): an
// endpoint starts draining, which rewrites only its instance's check (the
// service op changes nothing, and a check moves no node index); a restore
// of a snapshot taken before that takes the check back to passing. The
// witness holds the check's index too, so the next check sees it and the
// worker repairs the check.
func TestReadinessChangeUndoneByARestoreIsSeen(t *testing.T) {
	q := newQuietChecks(t)
	key := k8s.Key{Namespace: "ns", Name: "s0"}
	status := func() string {
		rs, err := q.f.store.reader().ReadPrefix(context.Background(), q.f.cluster.IDPrefix(key.Namespace, key.Name))
		if err != nil || len(rs) != 1 {
			return "?"
		}
		return string(rs[0].Check.Status)
	}
	snap := q.store.twin.Snapshot()
	svc := service("ns", "s0", "10.1.0.1")
	svc.Endpoints[0].Ready, svc.Endpoints[0].Serving, svc.Endpoints[0].Terminating = false, true, true
	q.w.set(key, svc)
	q.f.waitFor(t, "the check rewritten", func() bool { return status() == "warning" })
	q.store.twin.Restore(snap)
	if status() != "passing" {
		t.Fatalf("after the restore the check is %s, want passing", status())
	}
	if !q.check() {
		t.Fatal("the check after the restore skipped on the marks")
	}
	q.f.waitFor(t, "the check repaired", func() bool { return status() == "warning" })
	if sig, _ := q.hooks.got(); !slices.Equal(sig, []string{loss.SignalEntryLost}) {
		t.Fatalf("signals %v, want [%s]", sig, loss.SignalEntryLost)
	}
}
