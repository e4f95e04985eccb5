package loss

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
)

// told records what a Watch tells its owner.
type told struct {
	mu        sync.Mutex
	signals   []string
	answering int
	foreign   []string
}

func (o *told) lost(_ context.Context, found []Finding) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range found {
		o.signals = append(o.signals, f.Signal)
	}
}

func (o *told) get() (signals []string, answering int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.signals), o.answering
}

// newWatch is a Watch over store on a fake clock, its owner's callbacks
// recorded.
func newWatch(store *fakeStore, clk *clocktesting.FakeClock, stateKey string) (*Watch, *told) {
	o := &told{}
	w := New(Config{Store: store, Clock: clk, Interval: time.Second, StateKey: stateKey, Lost: o.lost,
		Foreign: func(nodes []consul.NodeEntry) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.foreign = o.foreign[:0]
			for _, n := range nodes {
				o.foreign = append(o.foreign, n.Name)
			}
		},
		Answering: func() { o.mu.Lock(); o.answering++; o.mu.Unlock() },
	})
	return w, o
}

// aQuietStore is one node of ours at index 40, the catalog's marks known.
func aQuietStore() *fakeStore {
	s := newFakeStore()
	s.view = nodeView(ours("k8s-a", 5))
	s.index["k8s-a"] = 40
	s.marks = consul.CatalogMarks{Nodes: 40, Checks: 41}
	return s
}

// epoch is far from the real time: a check that took the real clock's
// time instead of the injected clock's would show.
var epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// TestStepFollowsTheInjectedClock: a check asks for the catalog's marks
// from a read begun at or after its start by the injected clock (it took
// the real clock's time before, beside the injected one).
func TestStepFollowsTheInjectedClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	store := aQuietStore()
	w, _ := newWatch(store, clk, "")
	w.Step(t.Context(), "")
	clk.Step(time.Second)
	w.Step(t.Context(), "")
	store.edit(func(s *fakeStore) {
		if want := []time.Time{epoch, epoch.Add(time.Second)}; !slices.EqualFunc(s.after, want, time.Time.Equal) {
			t.Fatalf("marks asked from %v, want %v", s.after, want)
		}
	})
}

// TestWorkerEvidenceIsALoss: a worker's report is a loss told at once,
// without a read, and starts a new history (our committed indexes
// forgotten).
func TestWorkerEvidenceIsALoss(t *testing.T) {
	store := aQuietStore()
	store.committed["k8s-a"] = 40
	w, o := newWatch(store, clocktesting.NewFakeClock(epoch), "")
	w.Step(t.Context(), "service ns/web: 1 of 2 entries gone")
	if sig, _ := o.get(); !slices.Equal(sig, []string{SignalWorker}) {
		t.Fatalf("signals %v, want [%s]", sig, SignalWorker)
	}
	store.edit(func(s *fakeStore) {
		if s.nodeReads != 0 || len(s.committed) != 0 {
			t.Fatalf("%d node reads, committed %v: want none, and the history reset", s.nodeReads, s.committed)
		}
	})
}

// TestQuietCatalogIsNotRead: once a check read every node and found
// nothing, checks under the same marks, with no write of ours since, read
// nothing; marks that moved, or a witness of ours from after that check,
// make the next one read.
func TestQuietCatalogIsNotRead(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	store := aQuietStore()
	w, o := newWatch(store, clk, "")
	reads := func() int { store.mu.Lock(); defer store.mu.Unlock(); return store.nodeReads }
	step := func() int {
		t.Helper()
		before := reads()
		clk.Step(time.Second)
		w.Step(t.Context(), "")
		return reads() - before
	}
	if n := step(); n != 1 {
		t.Fatalf("the first check read the nodes %d times, want 1", n)
	}
	for i := range 3 {
		if n := step(); n != 0 {
			t.Fatalf("quiet check %d read the nodes", i+1)
		}
	}
	store.edit(func(s *fakeStore) { s.marks.Checks++ })
	if n := step(); n != 1 {
		t.Fatal("the check after the marks moved did not read")
	}
	store.edit(func(s *fakeStore) {
		s.ws = append(s.ws, consul.Witness{Node: "k8s-a", ID: "a", Name: "s0", Index: 40, At: clk.Now()})
		s.entries["a"] = 40
	})
	if n := step(); n != 1 {
		t.Fatal("the check after a witness of ours did not read")
	}
	if n := step(); n != 0 {
		t.Fatal("the check after that read again")
	}
	if sig, _ := o.get(); len(sig) != 0 {
		t.Fatalf("signals %v over a quiet catalog", sig)
	}
}

// TestNoAnswerSettlesNothing: a check that got no answer finds nothing and
// proves nothing; the witnesses standing when answers stopped are read
// once Consul answers again (the last writes before a crash are those it
// loses), and the owner hears that Consul answers again after the loss.
func TestNoAnswerSettlesNothing(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	store := aQuietStore()
	w, o := newWatch(store, clk, "")
	w.Step(t.Context(), "")
	x := consul.Witness{Node: "k8s-a", ID: "x", Name: "s0", Index: 70, At: clk.Now().Add(time.Second)}
	store.edit(func(s *fakeStore) { s.ws, s.entries["x"], s.down = []consul.Witness{x}, 70, true })
	clk.Step(time.Second)
	w.Step(t.Context(), "")
	if sig, answering := o.get(); len(sig) != 0 || answering != 0 {
		t.Fatalf("signals %v, answering %d from a check without answers", sig, answering)
	}
	// The crash lost x; a write after it is the newest witness, and is
	// there.
	y := consul.Witness{Node: "k8s-a", ID: "y", Name: "s0", Index: 90, At: clk.Now().Add(time.Second)}
	store.edit(func(s *fakeStore) {
		delete(s.entries, "x")
		s.ws, s.entries["y"], s.down = []consul.Witness{x, y}, 90, false
	})
	clk.Step(5 * time.Second)
	w.Step(t.Context(), "")
	if sig, answering := o.get(); !slices.Equal(sig, []string{SignalEntryLost}) || answering != 1 {
		t.Fatalf("signals %v, answering %d; want [%s] and 1", sig, answering, SignalEntryLost)
	}
}

// TestKVIndexGoingBack: Consul's KV index below one read before is a
// loss, even with every node's index where it was.
func TestKVIndexGoingBack(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	store := aQuietStore()
	store.marks = consul.CatalogMarks{} // unknown: every check reads
	store.kv = 300
	w, o := newWatch(store, clk, "fleetsync/clusters/test.index-probe")
	w.Step(t.Context(), "")
	store.edit(func(s *fakeStore) { s.kv = 310 })
	w.Step(t.Context(), "")
	if sig, _ := o.get(); len(sig) != 0 {
		t.Fatalf("signals %v with the KV index moving on", sig)
	}
	store.edit(func(s *fakeStore) { s.kv = 200 })
	w.Step(t.Context(), "")
	if sig, _ := o.get(); !slices.Equal(sig, []string{SignalIndexBack}) {
		t.Fatalf("signals %v, want [%s]", sig, SignalIndexBack)
	}
}

// TestForeignNodesAreTold: every node list read tells the owner the
// look-alike nodes in it.
func TestForeignNodesAreTold(t *testing.T) {
	store := aQuietStore()
	store.view = nodeView(ours("k8s-a", 5), consul.NodeEntry{Name: "k8s-a.1", CreateIndex: 50})
	w, o := newWatch(store, clocktesting.NewFakeClock(epoch), "")
	w.Step(t.Context(), "")
	o.mu.Lock()
	defer o.mu.Unlock()
	if !slices.Equal(o.foreign, []string{"k8s-a.1"}) {
		t.Fatalf("foreign %v, want [k8s-a.1]", o.foreign)
	}
}

// TestRunChecksOnTheClockAndAtAReport: Run checks at once, then each
// Interval of the injected clock, and at once on a worker's report.
func TestRunChecksOnTheClockAndAtAReport(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	store := aQuietStore()
	store.marks = consul.CatalogMarks{} // unknown: every check reads
	w, o := newWatch(store, clk, "")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	reads := func() int { store.mu.Lock(); defer store.mu.Unlock(); return store.nodeReads }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) { // failsafe, never reached when right
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the first check's timer", clk.HasWaiters)
	if n := reads(); n != 1 {
		t.Fatalf("%d node reads before the first interval, want 1", n)
	}
	clk.Step(time.Second)
	waitFor("the second check", func() bool { return reads() == 2 })
	w.Report("service ns/web: 1 of 2 entries gone", nil)
	waitFor("the report told", func() bool { sig, _ := o.get(); return len(sig) == 1 })
	if sig, _ := o.get(); sig[0] != SignalWorker {
		t.Fatalf("signals %v, want [%s]", sig, SignalWorker)
	}
}
