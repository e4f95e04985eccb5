package worker

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// TestAntiEntropy: a periodic pass with nothing drifted writes nothing; an
// instance deleted or edited behind the worker's back is repaired by the
// next pass; Resync triggers a pass at once. Reads go by Consul name.
func TestAntiEntropy(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), func(h *harness, o *Options) {
		o.ResyncPeriod = 5 * W
	})
	h.start()
	h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")

	// A pass with nothing drifted: one read by name, no write.
	h.clk.Step(8 * W) // the first pass falls within 1.5 periods
	if f := h.flush(); f.Wrote || !f.Resync || f.Err != nil {
		t.Fatalf("quiet pass: %+v", f)
	}
	if h.store.nameReads() != 1 {
		t.Fatalf("%d reads by name, want 1", h.store.nameReads())
	}
	if st := h.w.Status(); st.Resyncs != 1 || st.Repairs != 0 {
		t.Fatalf("status after a quiet pass: resyncs %d repairs %d", st.Resyncs, st.Repairs)
	}

	// Someone deletes one instance and edits the other's tags.
	ids := h.store.instances()
	h.store.remove(ids[0].ID)
	h.store.edit(ids[1].ID, func(r *consul.Registered) {
		r.Tags = append(r.Tags, "hijacked") // still carries our mark
	})
	h.w.Resync()
	f := h.flush()
	if !f.Resync || !f.Wrote {
		t.Fatalf("repair pass: %+v", f)
	}
	wantChange(t, h.apply(), "+10.0.0.1:8080", "~10.0.0.2:8080[k8s east]")
	if st := h.w.Status(); st.Repairs != 1 {
		t.Errorf("repairs = %d, want 1", st.Repairs)
	}
	h.converged()
}

// TestAntiEntropyLeavesUnmarkedEntriesAlone: an entry with our ID whose mark
// someone removed is no longer ours: the worker never overwrites it, does
// not try to create it again (that create would fail every flush of the
// Service), and reports it once.
func TestAntiEntropyLeavesUnmarkedEntriesAlone(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
	h.start()
	h.wrote("+10.0.0.1:8080")
	id := h.store.instances()[0].ID
	h.store.edit(id, func(r *consul.Registered) { r.Tags = []string{"hijacked"}; r.Meta = nil })
	h.w.Resync()
	h.awaitTimer() // the pass waits for the window that the write opened
	h.clk.Step(W)
	f := h.flush()
	if f.Err != nil || f.Wrote {
		t.Fatalf("pass over an unmarked entry with our id: %+v", f)
	}
	if got := h.store.instances()[0]; len(got.Tags) != 1 || got.Tags[0] != "hijacked" {
		t.Fatalf("unmarked entry was modified: %+v", got)
	}
	if n := h.rep.count(ReasonEntryNotOurs); n != 1 {
		t.Fatalf("%d %s reports, want 1: %+v", n, ReasonEntryNotOurs, h.rep.got())
	}
	if st := h.w.Status(); st.Blocked != 1 {
		t.Errorf("status blocked = %d, want 1", st.Blocked)
	}
}

// TestTamperedEntryDoesNotFreezeTheService: one of the Service's IDs is
// held by someone else's entry; every other change of the Service lands in
// one flush, with or without a fresh read first, and the report is not
// repeated by later flushes.
func TestTamperedEntryDoesNotFreezeTheService(t *testing.T) {
	epD, epE := ready("10.0.0.4", "d"), ready("10.0.0.5", "e")
	scale := func(s *k8s.Service) { s.Endpoints = []k8s.Endpoint{epA, epB, epD, epE} } // C gone, D and E new
	for _, tc := range []struct {
		name    string
		resync  bool // a fresh read sees the tampered entry first
		edit    func(*k8s.Service)
		want    []string
		applies int // transactions tried: a stale CAS costs one more
	}{
		{"after a fresh read", true, scale, []string{"+10.0.0.4:8080", "+10.0.0.5:8080", "-10.0.0.3:8080"}, 1},
		{"found by a CAS conflict", false, func(s *k8s.Service) { scale(s); tags("v2")(s) },
			[]string{"+10.0.0.4:8080", "+10.0.0.5:8080", "~10.0.0.2:8080[k8s v2 east]", "-10.0.0.3:8080"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB, epC}), nil)
			h.start()
			h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080", "+10.0.0.3:8080")
			tampered := h.store.instances()[0]
			h.store.edit(tampered.ID, func(r *consul.Registered) {
				r.Tags = []string{"theirs"}
				r.Meta = map[string]string{"owner": "someone"}
			})
			if tc.resync {
				h.w.Resync()
				h.awaitTimer()
				h.clk.Step(W)
				if f := h.flush(); f.Err != nil || f.Wrote {
					t.Fatalf("pass: %+v", f)
				}
			}
			h.clk.Step(W)
			h.notify(tc.edit)
			var last consul.Change
			for range tc.applies {
				last = h.apply()
			}
			wantChange(t, last, tc.want...)
			if f := h.flush(); f.Err != nil || !f.Wrote {
				t.Fatalf("flush: %+v", f)
			}
			got := map[string]consul.Instance{}
			for _, in := range h.store.instances() {
				got[in.ID] = in
			}
			if in := got[tampered.ID]; !slices.Equal(in.Tags, []string{"theirs"}) || in.Meta["owner"] != "someone" {
				t.Fatalf("the tampered entry was touched: %+v", in)
			}
			spec, _ := Desired(h.k8s.svc, h.cfg)
			for _, d := range spec.Instances {
				if d.ID != tampered.ID && !got[d.ID].Equal(d) {
					t.Errorf("instance %s not converged: got %+v", d.ID, got[d.ID])
				}
			}
			if len(got) != len(spec.Instances) {
				t.Errorf("Consul holds %d entries, want %d (the desired ones, the tampered one in place of ours)", len(got), len(spec.Instances))
			}
			h.clk.Step(W)
			h.notify(func(*k8s.Service) {})
			h.flush()
			if n := h.rep.count(ReasonEntryNotOurs); n != 1 {
				t.Fatalf("%d %s reports after two flushes, want 1", n, ReasonEntryNotOurs)
			}
		})
	}
}

// TestRetryAfterUnreachableRereads: after a flush failed for want of an
// answer, the retry re-reads Consul first, so instances lost while Consul
// was away (it came back empty) are registered again, not only the change.
func TestRetryAfterUnreachableRereads(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
	h.start()
	h.wrote("+10.0.0.1:8080")
	h.store.failNext(1, errors.New("dial tcp 127.0.0.1:8500: connect: connection refused"))
	h.clk.Step(W)
	h.notify(addEndpoint(epB))
	wantChange(t, h.apply(), "+10.0.0.2:8080") // the attempt that fails
	if f := h.flush(); f.Err == nil {
		t.Fatal("flush did not fail")
	}
	h.store.remove(h.store.instances()[0].ID) // Consul came back empty
	h.awaitTimer()
	h.clk.Step(30 * time.Second) // past any backoff
	h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
	if h.store.nameReads() == 0 {
		t.Error("the retry did not re-read Consul")
	}
}

// TestBlockedInstanceRegisteredOnceTheForeignEntryIsGone: while someone
// else's entry holds one of its IDs, the worker reads its entries again
// every BlockedRecheck; once the entry is gone, the instance is
// registered then, not at the next anti-entropy pass (found by the soak:
// such an instance stayed missing until the periodic pass, minutes).
func TestBlockedInstanceRegisteredOnceTheForeignEntryIsGone(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), func(h *harness, o *Options) { o.BlockedRecheck = 5 * time.Second })
	h.start()
	h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
	tampered := h.store.instances()[0]
	h.store.edit(tampered.ID, func(r *consul.Registered) {
		r.Tags = []string{"theirs"}
		r.Meta = map[string]string{"owner": "someone"}
	})
	// A change of every instance finds the tampered entry (CAS conflict,
	// re-read) and leaves its instance out.
	h.clk.Step(W)
	h.notify(tags("v2"))
	h.apply()
	other := h.store.instances()[1]
	wantChange(t, h.apply(), "~"+other.Address+":8080[k8s v2 east]")
	if f := h.flush(); f.Err != nil || !f.Wrote {
		t.Fatalf("flush: %+v", f)
	}
	if st := h.w.Status(); st.Blocked != 1 {
		t.Fatalf("status says %d blocked, want 1", st.Blocked)
	}
	// Still there at the first recheck: a read, nothing written.
	h.awaitTimer()
	_, readsBefore := h.store.counts()
	h.clk.Step(5 * time.Second)
	if f := h.flush(); f.Err != nil || f.Wrote {
		t.Fatalf("recheck with the entry still there: %+v", f)
	}
	if _, reads := h.store.counts(); reads <= readsBefore {
		t.Fatal("the recheck did not read Consul")
	}
	// Gone: the next recheck registers ours, and nothing else happens.
	h.store.remove(tampered.ID)
	h.awaitTimer()
	h.clk.Step(5 * time.Second)
	h.wrote("+" + tampered.Address + ":8080")
	if st := h.w.Status(); st.Blocked != 0 {
		t.Fatalf("status still says %d blocked", st.Blocked)
	}
	// Nothing blocked: no recheck timer runs any more.
	h.until("went idle", func() bool { return h.w.Status().State == StateIdle })
	if h.clk.HasWaiters() {
		t.Fatal("a timer still runs with nothing blocked and nothing pending")
	}
}

// TestRetryEndsTheBackoff: a flush that failed while Consul was away is
// retried as soon as the supervisor says Consul answers again (Retry),
// not at the end of its backoff (found by the soak: after a Consul server
// came back, changes waited out backoffs of up to 30s).
func TestRetryEndsTheBackoff(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
		o.MinBackoff, o.MaxBackoff = 10*time.Second, time.Minute
	})
	h.start()
	h.wrote("+10.0.0.1:8080")
	h.store.failNext(1, errors.New("dial tcp 127.0.0.1:8500: connect: connection refused"))
	h.clk.Step(W)
	h.notify(addEndpoint(epB))
	h.apply() // fails
	if f := h.flush(); f.Err == nil {
		t.Fatal("flush did not fail")
	}
	h.awaitTimer()
	h.clk.Step(W) // the window is over, the backoff (8s at least) is not
	h.w.Retry()
	wantChange(t, h.apply(), "+10.0.0.2:8080")
	if f := h.flush(); f.Err != nil || !f.Wrote {
		t.Fatalf("retry: %+v", f)
	}
}

// TestPeriodicPassReadsOnlyWhatChanged: once a pass has read the Service's
// entries by name, a periodic pass over an unchanged catalog asks only for
// the catalog's marks (shared by the fleet: no index read, no read of the
// instances, no diff, no write); an entry edited or deleted behind the
// worker's back moves the marks and the name's index, and that pass reads
// and repairs. Resync always reads.
func TestPeriodicPassReadsOnlyWhatChanged(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), func(h *harness, o *Options) {
		o.ResyncPeriod = 5 * W
	})
	h.start()
	h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
	pass := func(what string, wantReads, wantIndexReads int, wrote bool) Flush {
		t.Helper()
		h.awaitTimer()
		h.clk.Step(8 * W) // past the next pass (4.5 to 5.5 W after the last, the first 2.5 to 7.5 W after the write)
		f := h.flush()
		if !f.Resync || f.Err != nil || f.Wrote != wrote {
			t.Fatalf("%s: %+v", what, f)
		}
		if got := h.store.nameReads(); got != wantReads {
			t.Errorf("%s: %d reads by name in all, want %d", what, got, wantReads)
		}
		if got := h.store.indexCalls(); got != wantIndexReads {
			t.Errorf("%s: %d index reads in all, want %d", what, got, wantIndexReads)
		}
		return f
	}
	pass("the first pass after a write", 1, 0, false)
	lookups := h.k8s.lookups()
	pass("a pass over an unchanged catalog", 1, 0, false)
	if n := h.k8s.lookups() - lookups; n != 0 {
		t.Errorf("a pass over an unchanged catalog looked the Service up %d times, want 0", n)
	}
	if st := h.w.Status(); st.Desired != 2 || st.Registered != 2 || st.State != StateIdle {
		t.Errorf("status after a pass that read nothing: desired %d registered %d state %s, want what the last look found (2, 2, idle)", st.Desired, st.Registered, st.State)
	}
	pass("another", 1, 0, false)

	ids := h.store.instances()
	h.store.setCheck(ids[1].ID, api.HealthCritical) // a check only: the node's own index would not move
	pass("a pass after a check was tampered with", 2, 1, true)
	wantChange(t, h.apply(), "~10.0.0.2:8080[k8s east]")
	pass("the pass after the repair reads (the write moved the index)", 3, 1, false)
	h.store.remove(ids[0].ID)
	pass("a pass after a delete", 4, 2, true)
	wantChange(t, h.apply(), "+10.0.0.1:8080")

	pass("the pass after the repair", 5, 2, false)
	h.w.Resync()
	h.awaitTimer()
	h.clk.Step(W)
	if f := h.flush(); !f.Resync || f.Wrote {
		t.Fatalf("Resync: %+v", f)
	}
	if got := h.store.nameReads(); got != 6 {
		t.Errorf("Resync over an unchanged catalog: %d reads by name in all, want 6 (it always reads)", got)
	}
	h.converged()
}

// TestEveryTwelfthPassReadsInFull: passes that find every index unmoved
// read nothing, but at most 11 in a row: the next reads every instance,
// for whatever the indexes cannot show.
func TestEveryTwelfthPassReadsInFull(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
		o.ResyncPeriod = 5 * W
	})
	h.start()
	h.wrote("+10.0.0.1:8080")
	for pass := 1; pass <= 1+fullReadEvery; pass++ {
		h.awaitTimer()
		h.clk.Step(8 * W)
		if f := h.flush(); !f.Resync || f.Wrote || f.Err != nil {
			t.Fatalf("pass %d: %+v", pass, f)
		}
		want := 1 // the first pass after the write reads
		if pass > fullReadEvery {
			want = 2
		}
		if got := h.store.nameReads(); got != want {
			t.Fatalf("after pass %d: %d reads by name, want %d", pass, got, want)
		}
	}
}

// TestAWriteElsewhereCostsOnePassOfIndexReads: a write anywhere else in the
// catalog moves the marks; the next pass then asks for the name's and the
// node's index, finds them unmoved and reads nothing, and takes the marks
// it read as the new reference, so the pass after costs no request again.
func TestAWriteElsewhereCostsOnePassOfIndexReads(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
		o.ResyncPeriod = 5 * W
	})
	h.start()
	h.wrote("+10.0.0.1:8080")
	pass := func(what string, wantIndexReads int) {
		t.Helper()
		h.awaitTimer()
		h.clk.Step(8 * W)
		if f := h.flush(); !f.Resync || f.Err != nil || f.Wrote {
			t.Fatalf("%s: %+v", what, f)
		}
		if got := h.store.nameReads(); got != 1 {
			t.Errorf("%s: %d reads by name in all, want 1 (the first pass's)", what, got)
		}
		if got := h.store.indexCalls(); got != wantIndexReads {
			t.Errorf("%s: %d name index reads in all, want %d", what, got, wantIndexReads)
		}
	}
	pass("the first pass after the write", 0) // reads by name
	pass("a pass over a quiet catalog", 0)
	if _, err := h.store.other.Catalog().Register(&api.CatalogRegistration{Node: "elsewhere", Address: "10.1.1.1",
		Service: &api.AgentService{ID: "theirs", Service: "theirs", Port: 80}}, nil); err != nil {
		t.Fatal(err)
	}
	pass("the pass after a write elsewhere", 1)
	pass("the pass after that", 1)
}

// zeroIndexStore answers reads by name and index requests with index 0
// (unknown), as the consul client does in Consul Enterprise scopes.
type zeroIndexStore struct{ *fakeStore }

func (s zeroIndexStore) ReadService(ctx context.Context, name string) ([]consul.Registered, uint64, error) {
	got, _, err := s.fakeStore.ReadService(ctx, name)
	return got, 0, err
}

func (s zeroIndexStore) ServiceIndex(ctx context.Context, name string) (uint64, error) {
	_, err := s.fakeStore.ServiceIndex(ctx, name)
	return 0, err
}

// TestUnknownIndexesMeanEveryPassReads: with no index to trust, no
// periodic pass skips its read.
func TestUnknownIndexesMeanEveryPassReads(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
		o.ResyncPeriod = 5 * W
		o.Store = zeroIndexStore{h.store}
	})
	h.start()
	h.wrote("+10.0.0.1:8080")
	for pass := 1; pass <= 3; pass++ {
		h.awaitTimer()
		h.clk.Step(8 * W)
		if f := h.flush(); !f.Resync || f.Err != nil {
			t.Fatalf("pass %d: %+v", pass, f)
		}
		if got := h.store.nameReads(); got != pass {
			t.Fatalf("after pass %d: %d reads by name, want %d", pass, got, pass)
		}
	}
}

// TestMarksFromBeforeAWriteAreNotTaken (found by review): the read by name
// after a write takes the catalog's marks only from a read begun after
// the write. Marks shared from before it would come back exactly with a
// restore of a snapshot taken before the write, and the passes after it
// would skip while Consul lacks the instance.
func TestMarksFromBeforeAWriteAreNotTaken(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
		o.ResyncPeriod = 5 * W
	})
	// A check on someone else's node: every catalog table has an index.
	if _, err := h.store.other.Catalog().Register(&api.CatalogRegistration{Node: "elsewhere", Address: "10.1.1.1",
		Service: &api.AgentService{ID: "theirs", Service: "theirs", Port: 80},
		Check:   &api.AgentCheck{CheckID: "c", Name: "c", Status: api.HealthPassing, ServiceID: "theirs"}}, nil); err != nil {
		t.Fatal(err)
	}
	pre, err := h.store.Client.CatalogMarks(t.Context(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	snap := h.store.twin.Snapshot()
	h.store.mu.Lock()
	h.store.staleMarks, h.store.staleAt = &pre, h.clk.Now()
	h.store.mu.Unlock()
	h.clk.Step(time.Millisecond) // the shared read began just before the write
	h.start()
	h.wrote("+10.0.0.1:8080")
	h.awaitTimer()
	h.clk.Step(8 * W)
	if f := h.flush(); !f.Resync || f.Err != nil || f.Wrote {
		t.Fatalf("the pass after the write: %+v", f)
	}
	h.store.mu.Lock()
	h.store.staleMarks = nil
	h.store.mu.Unlock()
	h.store.twin.Restore(snap)
	h.awaitTimer()
	h.clk.Step(8 * W)
	if f := h.flush(); !f.Resync || f.Err != nil || !f.Wrote {
		t.Fatalf("the pass after a restore that undid the write: %+v, want it to write the instance again", f)
	}
	wantChange(t, h.apply(), "+10.0.0.1:8080")
}

// TestFirstPassFallsAfterHalfAPeriod: a worker's first anti-entropy pass
// comes after half a period (it starts from a read just taken, or writes
// its state at once) and within one and a half, spread evenly over that
// period: the fleet's passes come at the rate of the later ones.
func TestFirstPassFallsAfterHalfAPeriod(t *testing.T) {
	const period = 5 * time.Minute
	var quarters [4]int // draws in each quarter of the window
	for range 10000 {
		d := firstResync(period)
		if d <= period/2 || d > period*3/2 {
			t.Fatalf("first pass after %v; want in (%v, %v]", d, period/2, period*3/2)
		}
		quarters[min(int((d-period/2-1)*4/period), 3)]++
	}
	for i, n := range quarters {
		if n < 2200 || n > 2800 {
			t.Errorf("first passes not spread evenly over the window: %v in its quarters (quarter %d)", quarters, i+1)
		}
	}
}

// TestFirstPassCountsFromTheFirstFlush: a worker's first anti-entropy pass
// comes at least half a period after its first flush ended (in a cold
// start, the write it waited its turn for), not after its start.
func TestFirstPassCountsFromTheFirstFlush(t *testing.T) {
	const period = 10 * W
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
		o.ResyncPeriod = period
	})
	release := h.store.blockNext()
	h.start()
	wantChange(t, h.apply(), "+10.0.0.1:8080")
	h.awaitBlocked()
	h.clk.Step(period) // a whole period while the first write waits its turn
	wrote := h.clk.Now()
	release()
	if f := h.flush(); !f.Wrote || f.Resync || f.Err != nil {
		t.Fatalf("first flush: %+v", f)
	}
	h.awaitTimer()
	h.clk.Step(period / 2)
	h.awaitTimer()
	h.clk.Step(period) // 1.5 periods after the write: the pass is due
	if f := h.flush(); !f.Resync || f.Wrote || f.Err != nil {
		t.Fatalf("first pass: %+v", f)
	}
	if at := h.store.firstRead(); !at.After(wrote.Add(period / 2)) {
		t.Errorf("the first pass read Consul %v after the write, want more than %v", at.Sub(wrote), period/2)
	}
	h.stop()
	h.quiet()
}
