package worker

import (
	"testing"

	"github.com/fleetsync/fleetsync/k8s"
)

// TestNotifyAllocatesNothing: however many events arrive while a worker
// cannot flush (Consul down, budget exhausted, a long window), they cost no
// memory: Notify folds them into one wake-up and one timestamp.
func TestNotifyAllocatesNothing(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil) // not started: nothing drains the trigger
	if allocs := testing.AllocsPerRun(10000, h.w.Notify); allocs != 0 {
		t.Fatalf("Notify allocates %v times per call, want 0", allocs)
	}
	if st := h.w.Status(); st.Events != 10001 || !st.Pending {
		t.Fatalf("events %d pending %v, want 10001 and true", st.Events, st.Pending)
	}
}
