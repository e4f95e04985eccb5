package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/k8s"
)

// budgetStore is a fakeStore with a write budget the test hands out.
type budgetStore struct {
	*fakeStore
	asked chan bool     // the high flag of each Acquire
	grant chan struct{} // one permit per receive
}

func (b *budgetStore) Acquire(ctx context.Context, high bool) (budget.Permit, error) {
	b.asked <- high
	select {
	case <-b.grant:
		return budget.Permit{}, nil
	case <-ctx.Done():
		return budget.Permit{}, ctx.Err()
	}
}

// newBudgetHarness is a harness on svc whose store hands out the write
// budget the test grants (grants buffered permits in advance) and counts
// the desired-state lookups.
func newBudgetHarness(t *testing.T, svc *k8s.Service, grants int) (*harness, *budgetStore, *atomic.Int64) {
	var bs *budgetStore
	lookups := new(atomic.Int64)
	h := newHarness(t, svc, func(h *harness, o *Options) {
		bs = &budgetStore{fakeStore: h.store, asked: make(chan bool, 10), grant: make(chan struct{}, grants)}
		o.Store = bs
		look := o.Lookup
		o.Lookup = func() (*k8s.Service, bool) {
			lookups.Add(1)
			return look()
		}
	})
	return h, bs, lookups
}

// TestBudgetPriorityAndLatestStateWins: the first (isolated) flush asks for
// high priority, a coalesced one for bulk; a change that arrives while the
// worker waits for budget joins the write it was waiting for.
func TestBudgetPriorityAndLatestStateWins(t *testing.T) {
	h, bs, _ := newBudgetHarness(t, newSvc(nil), 0)
	h.start()
	<-bs.asked // owning nothing, the worker waits for budget before it looks
	bs.grant <- struct{}{}
	if f := h.flush(); f.Wrote { // the first look: nothing to write yet
		t.Fatalf("first look wrote: %+v", f)
	}
	h.notify(addEndpoint(epA))
	if high := <-bs.asked; !high {
		t.Fatal("isolated change asked for bulk priority")
	}
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.1:8080")

	h.clk.Step(W / 2)
	h.notify(addEndpoint(epB)) // within the window: waits for its end
	h.awaitTimer()
	h.clk.Step(W / 2)
	if high := <-bs.asked; high {
		t.Fatal("coalesced change asked for high priority")
	}
	h.notify(addEndpoint(epC)) // arrives while the worker waits for budget
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.2:8080", "+10.0.0.3:8080")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	wantApplies(t, h, 2)
}

// TestBudgetDeregisterOnlyIsHigh: a change that only removes instances gets
// priority even when it was coalesced.
func TestBudgetDeregisterOnlyIsHigh(t *testing.T) {
	h, bs, _ := newBudgetHarness(t, newSvc(nil), 10)
	h.start()
	<-bs.asked // owning nothing, the worker waits for budget before it looks
	bs.grant <- struct{}{}
	h.flush() // the first look: nothing to write yet
	h.notify(func(s *k8s.Service) { s.Endpoints = []k8s.Endpoint{epA, epB} })
	<-bs.asked
	bs.grant <- struct{}{}
	h.flushWrote()
	h.clk.Step(time.Millisecond)
	h.notify(func(s *k8s.Service) { s.Endpoints = s.Endpoints[:1] })
	h.awaitTimer()
	h.clk.Step(W)
	if high := <-bs.asked; !high {
		t.Fatal("deregister-only change asked for bulk priority")
	}
	bs.grant <- struct{}{}
	h.wrote("-10.0.0.2:8080")
}

// TestBudgetWaitDoesNotRecomputeTheDesiredState: a worker that owns
// entries diffs before it waits for budget, and a change that waited with
// nothing newer arriving is written as diffed: the desired state is
// computed once per flush, not again after the wait.
func TestBudgetWaitDoesNotRecomputeTheDesiredState(t *testing.T) {
	h, bs, lookups := newBudgetHarness(t, newSvc([]k8s.Endpoint{epA}), 0)
	h.start()
	<-bs.asked
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.1:8080")
	h.clk.Step(W)
	h.notify(addEndpoint(epB))
	<-bs.asked
	before := lookups.Load()
	if before == 0 {
		t.Fatal("a worker that owns entries asked for budget before it looked")
	}
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.2:8080")
	if n := lookups.Load() - before; n != 0 {
		t.Errorf("the desired state was computed %d more times after the budget wait, want 0", n)
	}
}

// TestBudgetWaitedForFirstWhenNothingIsOwned: a worker that owns nothing
// (a cold start, a new Service) waits for budget before it computes its
// desired state, at the priority its flush asks for, so that 10,000 of
// them waiting hold no desired state or change; the look after the wait
// sees what came meanwhile and is the only one. A worker that owns
// entries and finds nothing to write asks for no budget at all.
func TestBudgetWaitedForFirstWhenNothingIsOwned(t *testing.T) {
	h, bs, lookups := newBudgetHarness(t, newSvc([]k8s.Endpoint{epA}), 0)
	h.start()
	if high := <-bs.asked; !high {
		t.Fatal("the first (isolated) flush asked for bulk priority")
	}
	if n := lookups.Load(); n != 0 {
		t.Fatalf("the desired state was computed %d times before the budget came, want 0", n)
	}
	h.notify(addEndpoint(epB)) // arrives while the worker waits
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
	if n := lookups.Load(); n != 1 {
		t.Errorf("the desired state was computed %d times, want 1", n)
	}
	h.clk.Step(W)
	h.w.Resync() // owns entries, nothing changed: no budget
	h.awaitIdle(2)
	select {
	case high := <-bs.asked:
		t.Fatalf("a look that wrote nothing asked for budget (high %v)", high)
	default:
	}
	wantApplies(t, h, 1)
}

// TestBudgetNotWaitedForByLooksThatWriteNothing: a worker that owns
// nothing and whose last look found nothing to write (a Service without
// endpoints) looks before it asks for budget, so its Service's changes
// cost no permit (nor a rate token) until one has something to write.
func TestBudgetNotWaitedForByLooksThatWriteNothing(t *testing.T) {
	h, bs, _ := newBudgetHarness(t, newSvc(nil), 10)
	h.start()
	<-bs.asked // the first look: owning nothing, it waits first
	bs.grant <- struct{}{}
	h.flush()
	for range 3 {
		h.notify(func(s *k8s.Service) { s.Annotations["note"] += "x" }) // nothing to write
		h.flush()
	}
	select {
	case high := <-bs.asked:
		t.Fatalf("a look that wrote nothing asked for budget (high %v)", high)
	default:
	}
	h.notify(addEndpoint(epA))
	<-bs.asked
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.1:8080")
}

// TestBudgetEarlyWaitCancelledDoesNotLook: a worker stopped while it waits
// for the budget before its first look stops without looking (a cold
// start's 10,000 waiting workers would all compute their desired states
// at once on the way out).
func TestBudgetEarlyWaitCancelledDoesNotLook(t *testing.T) {
	h, bs, lookups := newBudgetHarness(t, newSvc([]k8s.Endpoint{epA}), 0)
	h.start()
	<-bs.asked
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	if n := lookups.Load(); n != 0 {
		t.Errorf("the desired state was computed %d times after the wait was cancelled, want 0", n)
	}
	wantApplies(t, h, 0)
}

// TestLookAfterTheBudgetWaitKeepsTheBlockedRecheck: when a change arrives
// while the worker waits for budget, the flush reports the look it made
// after the wait, not the one before: an instance that look found blocked
// (someone else's entry holds its ID) keeps the recheck running and is
// registered once the entry is gone (the reviewer's finding: the blocked
// count of the second look was dropped, and nothing rechecked).
func TestLookAfterTheBudgetWaitKeepsTheBlockedRecheck(t *testing.T) {
	h, bs, _ := newBudgetHarness(t, newSvc([]k8s.Endpoint{epA, epB}), 0)
	h.start()
	<-bs.asked
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
	idA := h.store.instances()[0].ID
	h.store.edit(idA, func(r *consul.Registered) {
		r.Tags = []string{"theirs"}
		r.Meta = map[string]string{"owner": "someone"}
	})
	// A leaves the Service; its deregister finds the entry someone
	// else's (CAS conflict, re-read) and leaves it alone.
	h.clk.Step(W)
	h.notify(func(s *k8s.Service) { s.Endpoints = []k8s.Endpoint{epB} })
	<-bs.asked
	bs.grant <- struct{}{}
	wantChange(t, h.apply(), "-10.0.0.1:8080")
	if f := h.flush(); f.Err != nil {
		t.Fatalf("flush: %+v", f)
	}
	// C comes: the look finds nothing blocked and waits for budget; A
	// comes back meanwhile: the look after the wait leaves it out.
	h.clk.Step(W)
	h.notify(addEndpoint(epC))
	<-bs.asked
	h.notify(addEndpoint(epA))
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.3:8080")
	if st := h.w.Status(); st.Blocked != 1 || st.Desired != 2 {
		t.Fatalf("status says %d blocked and %d desired, want 1 and 2 (the look after the wait)", st.Blocked, st.Desired)
	}
	// Someone removes their entry: the recheck registers A.
	h.store.remove(idA)
	h.awaitTimer()
	h.clk.Step(DefaultBlockedRecheck)
	<-bs.asked
	bs.grant <- struct{}{}
	h.wrote("+10.0.0.1:8080")
}
