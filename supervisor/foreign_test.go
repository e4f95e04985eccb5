package supervisor

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestLookAlikeNodeGoneEndsBackoffs: a Service placed on a node that
// someone else registered under our name is not written (the flush fails
// and backs off); once its owner removes it, the next node check (every
// second in the daemon) has the worker retry at once, not at the end of a
// backoff of up to 30 s (measured on the real stack: 20.6 s).
func TestLookAlikeNodeGoneEndsBackoffs(t *testing.T) {
	w, _ := syncedWatcher("web", "10.1.0.1")
	clk := clocktesting.NewFakeClock(time.Now())
	store := newWatchStore()
	node := "k8s-test" // the cluster's one node: web's instance goes there
	if _, err := store.other.Catalog().Register(&api.CatalogRegistration{Node: node, Address: "10.9.9.9", NodeMeta: map[string]string{"team": "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	f := startWith(t, w, store, func(s *Supervisor) {
		s.opts.Clock, s.opts.NodeCheckInterval = clk, 10*time.Millisecond
	})
	<-store.nodeReads // the first check, at bootstrap
	f.waitFor(t, "the flush refused", func() bool { return store.appliesN() > 0 })
	f.waitFor(t, "the look-alike node reported", func() bool { return len(f.sup.Problems()) == 1 })
	if _, err := store.other.Catalog().Deregister(&api.CatalogDeregistration{Node: node}, nil); err != nil {
		t.Fatal(err)
	}
	// The fake clock moves in 10ms steps, 150ms at most in all: the
	// worker's backoff (160-240ms after its first failure) never ends by
	// itself here, while every step can end the check's 10ms wait.
	for steps := 0; len(f.sup.Problems()) != 0; steps++ {
		if steps == 15 {
			t.Fatal("the node check did not see the node gone within 150ms of fake time")
		}
		clk.Step(10 * time.Millisecond)
		select {
		case <-store.nodeReads:
		case <-time.After(200 * time.Millisecond): // the check's timer was not armed yet: step again
		}
	}
	f.waitFor(t, "web's instance written before its backoff ended", func() bool { return f.store.count("") == 1 })
}
