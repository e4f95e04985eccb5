package worker

import (
	"sync"
	"testing"

	"github.com/fleetsync/fleetsync/k8s"
)

// TestALookHoldsASlot: the desired state is computed while the worker
// holds one of the fleet's look slots (see Options.Looks), and the slot is free again once the
// flush is done (a look left holding one would stop the fleet's looks).
func TestALookHoldsASlot(t *testing.T) {
	slots := NewSlots(1)
	var mu sync.Mutex
	var held []int // Looks in use at each lookup
	h := newHarness(t, newSvc(nil), func(h *harness, o *Options) {
		o.Looks = slots
		look := o.Lookup
		o.Lookup = func() (*k8s.Service, bool) {
			mu.Lock()
			held = append(held, slots.InUse())
			mu.Unlock()
			return look()
		}
	})
	h.start()
	h.flush()
	h.notify(addEndpoint(epA))
	h.wrote("+10.0.0.1:8080")
	mu.Lock()
	defer mu.Unlock()
	// Each flush's look holds the slot during its lookup; the flush's
	// other lookups (is the Service still selected?) need none.
	looks := 0
	for _, n := range held {
		if n > 1 {
			t.Fatalf("lookups saw %v slots in use: more than the one there is", held)
		}
		looks += n
	}
	if looks < 2 {
		t.Fatalf("lookups saw %v slots in use: want the slot held by both flushes' looks", held)
	}
	if n := slots.InUse(); n != 0 {
		t.Errorf("%d slots in use after the flushes, want 0", n)
	}
}

func TestSlotsBound(t *testing.T) {
	s := NewSlots(3)
	for range 3 {
		s.acquire()
	}
	if n := s.InUse(); n != 3 {
		t.Fatalf("InUse = %d after 3 acquires, want 3", n)
	}
	select {
	case s.c <- struct{}{}:
		t.Fatal("a fourth slot was free")
	default:
	}
	s.release()
	if n := s.InUse(); n != 2 {
		t.Fatalf("InUse = %d after a release, want 2", n)
	}
	var none *Slots // unbounded
	none.acquire()
	none.release()
	if n := none.InUse(); n != 0 || NewSlots(0).c == nil || cap(NewSlots(0).c) != 1 {
		t.Fatal("nil Slots or NewSlots(0) misbehave")
	}
}
