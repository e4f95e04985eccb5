package worker

import (
	"errors"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/fence"
	"github.com/fleetsync/fleetsync/k8s"
)

// TestRunFenced: the worker writes under its shard's fence; another
// replica takes the shard; the worker's next write (a delete) is refused
// on the fence and Run returns ErrFenced at once: no retry after a backoff,
// no final flush, the refused delete never lands.
func TestRunFenced(t *testing.T) {
	var mine, theirs *fence.Fences
	h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), func(h *harness, o *Options) {
		mine = fence.New(h.store.twin.Client(), fence.Options{ClusterID: o.Config.Cluster.ID(), Holder: "a"})
		theirs = fence.New(h.store.twin.Client(), fence.Options{ClusterID: o.Config.Cluster.ID(), Holder: "b"})
		tok, err := mine.Take(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		o.Fence = tok
	})
	h.start()
	h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
	h.awaitIdle(1)

	if _, err := theirs.Take(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	h.clk.Step(W)
	h.notify(func(s *k8s.Service) { s.Endpoints = []k8s.Endpoint{epA} })
	wantChange(t, h.apply(), "-10.0.0.2:8080")
	if f := h.flush(); !errors.Is(f.Err, consul.ErrFenced) {
		t.Fatalf("flush error %v, want ErrFenced", f.Err)
	}
	if err := h.wait(); !errors.Is(err, ErrFenced) {
		t.Fatalf("Run returned %v, want ErrFenced", err)
	}
	h.quiet()
	wantApplies(t, h, 2)
	if got := h.store.instances(); len(got) != 2 {
		t.Errorf("in Consul: %v, want both instances (the stale delete refused)", ids(got))
	}
}
