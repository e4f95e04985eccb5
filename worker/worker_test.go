package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

const W = time.Second // the default window of the harness

var (
	epA = ready("10.0.0.1", "a")
	epB = ready("10.0.0.2", "b")
	epC = ready("10.0.0.3", "c")
)

func gen(k int) func(*k8s.Service) { return tags(fmt.Sprintf("gen-%d", k)) }

func genA(k int) string { return fmt.Sprintf("~10.0.0.1:8080[k8s gen-%d east]", k) }

func wantApplies(t *testing.T, h *harness, n int) {
	t.Helper()
	if got, _ := h.store.counts(); got != n {
		t.Errorf("%d applies, want %d", got, n)
	}
}

func wantLastFlush(t *testing.T, st Status, at time.Duration) {
	t.Helper()
	if !st.LastFlush.Equal(t0.Add(at)) {
		t.Errorf("last flush at +%v, want +%v", st.LastFlush.Sub(t0), at)
	}
}

// TestRunWindow covers the window rules of doc.go.
func TestRunWindow(t *testing.T) {
	t.Run("isolated change is flushed at once", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		h.start()
		h.wrote("+10.0.0.1:8080") // the first flush does not wait
		wantLastFlush(t, h.awaitIdle(1), 0)

		h.clk.Step(W) // exactly W after the last flush
		h.notify(addEndpoint(epB))
		h.wrote("+10.0.0.2:8080")
		wantLastFlush(t, h.awaitIdle(2), W)

		h.clk.Step(time.Hour)
		h.notify(tags("x"))
		h.wrote("~10.0.0.1:8080[k8s x east]", "~10.0.0.2:8080[k8s x east]")
		wantLastFlush(t, h.awaitIdle(3), W+time.Hour)

		if err := h.stop(); err != nil {
			t.Fatal(err)
		}
		h.quiet()
		wantApplies(t, h, 3)
		h.converged()
	})

	t.Run("burst within W is one flush at the window end with the latest state", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		h.start()
		h.wrote("+10.0.0.1:8080")
		h.awaitIdle(1)

		for k := 1; k <= 3; k++ {
			if k == 1 {
				h.clk.Step(W / 4)
			} else {
				h.stepNotFired(W / 4)
			}
			h.notify(gen(k))
			h.notify(nil) // repeated notifications change nothing
		}
		h.notify(addEndpoint(epB))
		h.stepFire(W / 4) // +W: the window has ended
		f := h.wrote("+10.0.0.2:8080", genA(3))
		if f.Coalesced != 7 {
			t.Errorf("Coalesced = %d, want 7", f.Coalesced)
		}
		if f.Latency != 3*W/4 {
			t.Errorf("Latency = %v, want %v (from the first pending change)", f.Latency, 3*W/4)
		}
		wantLastFlush(t, h.awaitIdle(2), W)

		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
		h.converged()
	})

	t.Run("endless stream is flushed once per W", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		h.start()
		h.wrote("+10.0.0.1:8080")
		h.awaitIdle(1)

		h.clk.Step(W / 10)
		for k := 1; k <= 100; k++ {
			h.notify(gen(k))
			if k%10 == 9 {
				// The window ends with this step: one flush, with the
				// latest change.
				h.stepFire(W / 10)
				h.wrote(genA(k))
				h.awaitIdle(uint64(1 + (k+1)/10))
			} else {
				h.stepNotFired(W / 10)
			}
		}
		// Change 100 came at +10W, right after the tenth flush: it waits
		// for the window that started then.
		h.stepNotFired(W - W/10 - 1)
		h.stepFire(1)
		h.wrote(genA(100))
		wantLastFlush(t, h.awaitIdle(12), 11*W)

		h.stop()
		h.quiet()
		wantApplies(t, h, 12)
		h.converged()
	})

	t.Run("window is counted from the end of the last flush", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		h.store.onApply = func() { h.clk.Step(300 * time.Millisecond) } // a slow write
		h.start()
		h.wrote("+10.0.0.1:8080")
		wantLastFlush(t, h.awaitIdle(1), 300*time.Millisecond)

		h.clk.Step(200 * time.Millisecond)
		h.notify(addEndpoint(epB))
		h.stepNotFired(800*time.Millisecond - 1) // W after the start of the flush: too early
		h.stepFire(1)                            // W after its end
		h.wrote("+10.0.0.2:8080")
		wantLastFlush(t, h.awaitIdle(2), 1600*time.Millisecond)

		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
	})

	t.Run("change during a flush is flushed once more after W", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		release := h.store.blockNext()
		h.start()
		wantChange(t, h.apply(), "+10.0.0.1:8080")
		h.awaitBlocked()
		if st := h.w.Status(); st.State != StateFlushing {
			t.Errorf("state %q while the Apply is blocked, want %q", st.State, StateFlushing)
		}
		h.notify(addEndpoint(epB))
		h.notify(gen(1))
		release()
		if f := h.flush(); !f.Wrote || f.Err != nil {
			t.Fatalf("first flush: %+v", f)
		}
		h.stepNotFired(W - 1)
		h.stepFire(1)
		h.wrote("+10.0.0.2:8080", genA(1))
		wantLastFlush(t, h.awaitIdle(2), W)

		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
		h.converged()
	})

	t.Run("window 0 flushes every change at once", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(_ *harness, o *Options) { o.Config.DefaultWindow = 0 })
		h.start()
		h.wrote("+10.0.0.1:8080")
		h.awaitIdle(1)
		for k := 1; k <= 5; k++ {
			h.notify(gen(k))
			h.wrote(genA(k))
			h.awaitIdle(uint64(k + 1)) // no timer either
		}
		h.stop()
		h.quiet()
		wantApplies(t, h, 6)
		if !h.clk.Now().Equal(t0) {
			t.Error("the clock moved")
		}
	})

	t.Run("a look that writes nothing opens no window", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		h.start()
		h.wrote("+10.0.0.1:8080")
		h.awaitIdle(1)

		h.clk.Step(W)
		h.notify(nil) // nothing changed in Consul's terms
		if f := h.flush(); f.Wrote || f.Err != nil {
			t.Fatalf("flush %+v", f)
		}
		h.awaitIdle(2)
		h.clk.Step(W / 2)
		h.notify(addEndpoint(epB)) // 1.5 W after the last write: at once
		h.wrote("+10.0.0.2:8080")
		wantLastFlush(t, h.awaitIdle(3), 3*W/2)

		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
	})

	t.Run("window annotation takes effect for the next scheduling", func(t *testing.T) {
		const def = 10 * time.Second
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(_ *harness, o *Options) { o.Config.DefaultWindow = def })
		h.start()
		h.wrote("+10.0.0.1:8080")
		if st := h.awaitIdle(1); st.Window != def {
			t.Fatalf("window %v", st.Window)
		}

		h.clk.Step(time.Second)
		h.notify(func(s *k8s.Service) {
			s.Annotations[AnnotationWindow] = "2s"
			s.Endpoints = append(s.Endpoints, epB)
		})
		h.stepNotFired(8 * time.Second) // the change waits for the window it came in
		h.stepFire(time.Second)
		if f := h.wrote("+10.0.0.2:8080"); f.Window != 2*time.Second {
			t.Errorf("flush window %v, want 2s", f.Window)
		}
		st := h.awaitIdle(2)
		if st.Window != 2*time.Second || st.WindowText != "2s" {
			t.Errorf("window %v (%q), want 2s", st.Window, st.WindowText)
		}

		h.clk.Step(time.Second) // +11s
		h.notify(gen(1))
		h.stepNotFired(time.Second - 1)
		h.stepFire(1) // +12s: 2s after the last flush
		h.wrote(genA(1), "~10.0.0.2:8080[k8s gen-1 east]")
		h.awaitIdle(3)

		// An unusable value: reported, and the default window is used.
		h.clk.Step(2 * time.Second) // +14s: leading edge under W=2s
		h.notify(func(s *k8s.Service) {
			s.Annotations[AnnotationWindow] = "soon"
			s.Annotations[AnnotationTags] = "gen-2"
		})
		if f := h.wrote(genA(2), "~10.0.0.2:8080[k8s gen-2 east]"); f.Window != def {
			t.Errorf("flush window %v, want the default", f.Window)
		}
		if st := h.awaitIdle(4); st.Window != def || st.State != StateIdle {
			t.Errorf("after a bad window: %+v", st)
		}
		ws := h.rep.got()
		if len(ws) != 1 || ws[0].reason != ReasonInvalidAnnotation || !strings.Contains(ws[0].msg, AnnotationWindow) || !strings.Contains(ws[0].msg, `"soon"`) {
			t.Errorf("warnings %+v, want one naming %s", ws, AnnotationWindow)
		}
		h.clk.Step(time.Second) // +15s
		h.notify(gen(3))
		h.stepNotFired(9*time.Second - 1)
		h.stepFire(1) // +24s: the default window after the last flush
		h.wrote(genA(3), "~10.0.0.2:8080[k8s gen-3 east]")
		h.awaitIdle(5)

		h.stop()
		h.quiet()
		wantApplies(t, h, 5)
	})

	t.Run("gate: nothing before it opens, then one flush", func(t *testing.T) {
		gate := make(chan struct{})
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
			o.Gate = gate
			h.k8s.gate = gate
		})
		h.start()
		h.awaitGate()
		h.notify(nil)
		h.notify(addEndpoint(epB))
		if st := h.w.Status(); st.State != StateWaiting || st.Looks != 0 || st.Events != 2 {
			t.Errorf("status before the gate: %+v", st)
		}
		release := h.store.blockNext()
		close(gate)
		wantChange(t, h.apply(), "+10.0.0.1:8080", "+10.0.0.2:8080")
		h.awaitBlocked()
		// The running flush read the state after both notifications:
		// they must not cause another flush.
		if n := len(h.w.trigger); n != 0 {
			t.Errorf("a notification covered by the running flush is still pending")
		}
		release()
		if f := h.flush(); f.Err != nil || !f.Wrote || f.Coalesced != 2 {
			t.Errorf("first flush: %+v", f)
		}
		h.awaitIdle(1)

		h.clk.Step(W)
		h.notify(tags("x"))
		h.wrote("~10.0.0.1:8080[k8s x east]", "~10.0.0.2:8080[k8s x east]")
		h.awaitIdle(2)

		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
		if h.k8s.beforeGate != 0 {
			t.Errorf("%d lookups before the gate opened", h.k8s.beforeGate)
		}
	})
}

func TestRunRetry(t *testing.T) {
	t.Run("backoff longer than W; a newer change joins the retry", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(_ *harness, o *Options) {
			o.MinBackoff, o.MaxBackoff = 2*time.Second, 8*time.Second
		})
		h.store.failNext(2, errTransient)
		h.start()

		wantChange(t, h.apply(), "+10.0.0.1:8080")
		if f := h.flush(); !errors.Is(f.Err, errTransient) || f.Wrote {
			t.Fatalf("flush 1: %+v", f)
		}
		if st := h.w.Status(); st.State != StateBackingOff || st.Failures != 1 || !st.Pending || !strings.Contains(st.LastError, "leader lost") {
			t.Errorf("status after a failure: %+v", st)
		}
		h.stepNotFired(1500 * time.Millisecond) // past W, before the backoff (2s -20%)
		h.notify(addEndpoint(epB))
		h.stepFire(900 * time.Millisecond) // +2.4s: after the backoff (2s +20%)

		wantChange(t, h.apply(), "+10.0.0.1:8080", "+10.0.0.2:8080")
		if f := h.flush(); !errors.Is(f.Err, errTransient) {
			t.Fatalf("flush 2: %+v", f)
		}
		if st := h.w.Status(); st.Failures != 2 {
			t.Errorf("failures %d, want 2", st.Failures)
		}
		h.stepNotFired(3100 * time.Millisecond) // the backoff doubled: 4s -20%
		h.stepFire(1700 * time.Millisecond)     // 4s +20%

		f := h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
		if want := 7200*time.Millisecond - 1500*time.Millisecond; f.Latency != want {
			t.Errorf("latency %v, want %v (from the change that joined the retry)", f.Latency, want)
		}
		st := h.awaitIdle(3)
		if st.Failures != 0 || st.LastError != "" || st.Registered != 2 || st.Desired != 2 {
			t.Errorf("status after recovery: %+v", st)
		}

		h.stop()
		h.quiet()
		wantApplies(t, h, 3)
		h.converged()
	})

	t.Run("backoff shorter than W: retry at W", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		h.store.failNext(1, errTransient)
		h.start()
		h.apply()
		if f := h.flush(); f.Err == nil {
			t.Fatal("flush did not fail")
		}
		h.stepNotFired(W - 1)
		h.stepFire(1)
		h.wrote("+10.0.0.1:8080")
		h.awaitIdle(2)
		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
	})

	t.Run("a retry with nothing to write ends the backoff", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(_ *harness, o *Options) {
			o.MinBackoff, o.MaxBackoff = 2*time.Second, 8*time.Second
		})
		h.store.failNext(1, errTransient)
		h.start()
		h.apply()
		if f := h.flush(); f.Err == nil {
			t.Fatal("flush did not fail")
		}
		h.notify(func(s *k8s.Service) { s.Endpoints = nil }) // back to what Consul has
		h.stepFire(2400 * time.Millisecond)
		if f := h.flush(); f.Err != nil || f.Wrote {
			t.Fatalf("retry %+v", f)
		}
		if st := h.awaitIdle(2); st.Failures != 0 || st.LastError != "" {
			t.Errorf("status after the retry: %+v", st)
		}

		h.store.failNext(1, errTransient)
		h.clk.Step(time.Hour)
		h.notify(addEndpoint(epA))
		h.apply()
		h.flush()
		if st := h.w.Status(); st.Failures != 1 {
			t.Errorf("%d failures, want 1 (a new run of failures)", st.Failures)
		}
		h.stepNotFired(1600*time.Millisecond - 1) // the backoff starts at MinBackoff again
		h.stepFire(800 * time.Millisecond)
		h.wrote("+10.0.0.1:8080")
		h.awaitIdle(4)
		h.stop()
		h.quiet()
		wantApplies(t, h, 3)
	})

	t.Run("read of the owned state fails", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), func(h *harness, o *Options) {
			o.OwnedKnown = false
			h.store.put(passing(epA, 8080))
		})
		h.store.readFails = 1
		h.start()
		if f := h.flush(); !errors.Is(f.Err, errTransient) || f.Wrote {
			t.Fatalf("flush: %+v", f)
		}
		h.stepNotFired(W - 1)
		h.stepFire(1)
		h.wrote("+10.0.0.2:8080") // a was read, not registered again
		if st := h.awaitIdle(2); st.Registered != 2 || st.Desired != 2 {
			t.Errorf("status %+v", st)
		}
		if _, reads := h.store.counts(); reads != 2 {
			t.Errorf("%d reads, want 2", reads)
		}
		h.stop()
		h.quiet()
		wantApplies(t, h, 1)
	})
}

func TestRunConflict(t *testing.T) {
	aID := passing(epA, 8080).ID
	conflictErr := fmt.Errorf("apply: %w", consul.ErrConflict)

	t.Run("entry changed by someone else: re-read, diff again, repair", func(t *testing.T) {
		var old consul.Registered
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
			old = h.store.put(passing(epA, 8080))
			o.Owned = holdAll(ownedMap(old))
		})
		h.store.edit(aID, func(r *consul.Registered) { r.Meta["edited-by"] = "someone" })
		edited := h.store.entry(aID)
		h.start()
		if f := h.flush(); f.Wrote { // the worker's view agrees: nothing to write
			t.Fatalf("first flush wrote")
		}
		h.awaitIdle(1)

		h.clk.Step(W)
		h.notify(tags("blue"))
		first := h.apply()
		second := h.apply()
		f := h.flush()
		if f.Err != nil || !f.Wrote {
			t.Fatalf("flush: %+v", f)
		}
		wantChange(t, first, "~10.0.0.1:8080[k8s blue east]")
		wantChange(t, second, "~10.0.0.1:8080[k8s blue east]")
		if first.Update[0].Have.ServiceIndex != old.ServiceIndex || second.Update[0].Have.ServiceIndex != edited.ServiceIndex ||
			edited.ServiceIndex == old.ServiceIndex {
			t.Errorf("second Apply not based on a fresh read: %+v", second.Update[0].Have)
		}
		_, reads := h.store.counts()
		_, conflicts, _ := h.obs.snapshot()
		if reads != 1 || conflicts != 1 {
			t.Errorf("%d reads, %d conflicts; want 1, 1", reads, conflicts)
		}
		h.awaitIdle(2)
		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
		h.converged() // the foreign edit is gone
	})

	t.Run("entry deleted by someone else: registered again", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
			o.Owned = holdAll(ownedMap(h.store.put(passing(epA, 8080))))
		})
		h.store.remove(aID)
		h.start()
		h.flush()
		h.awaitIdle(1)

		h.clk.Step(W)
		h.notify(tags("blue"))
		wantChange(t, h.apply(), "~10.0.0.1:8080[k8s blue east]")
		h.wrote("+10.0.0.1:8080")
		if _, reads := h.store.counts(); reads != 1 {
			t.Errorf("%d reads, want 1", reads)
		}
		h.awaitIdle(2)
		h.stop()
		h.quiet()
		wantApplies(t, h, 2)
		h.converged()
	})

	t.Run("conflict twice: the flush fails and is retried after a re-read", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
		h.store.failNext(2, conflictErr)
		h.start()
		wantChange(t, h.apply(), "+10.0.0.1:8080")
		wantChange(t, h.apply(), "+10.0.0.1:8080")
		if f := h.flush(); !errors.Is(f.Err, consul.ErrConflict) {
			t.Fatalf("flush: %+v", f)
		}
		h.stepNotFired(W - 1)
		h.stepFire(1)
		h.wrote("+10.0.0.1:8080")
		h.awaitIdle(2)
		_, reads := h.store.counts()
		_, conflicts, _ := h.obs.snapshot()
		if reads != 2 || conflicts != 2 {
			t.Errorf("%d reads, %d conflicts; want 2, 2", reads, conflicts)
		}
		h.stop()
		h.quiet()
		wantApplies(t, h, 3)
	})
}

func TestRunOwnedUnknown(t *testing.T) {
	t.Run("Consul agrees: read once, nothing written", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), func(h *harness, o *Options) {
			o.OwnedKnown = false
			h.store.put(passing(epA, 8080))
			h.store.put(passing(epB, 8080))
		})
		h.start()
		if f := h.flush(); f.Wrote || f.Err != nil || f.Registered != 2 || f.Desired != 2 {
			t.Errorf("flush %+v", f)
		}
		h.awaitIdle(1)
		h.stop()
		h.quiet()
		if applies, reads := h.store.counts(); applies != 0 || reads != 1 {
			t.Errorf("%d applies, %d reads; want 0, 1", applies, reads)
		}
	})

	t.Run("stale instance deregistered, others left alone", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(h *harness, o *Options) {
			o.OwnedKnown = false
			h.store.put(passing(epA, 8080))
			h.store.put(passing(epC, 8080))
			other := passing(epB, 8080)
			other.ID, other.Meta[MetaService] = "k8s_east_shop_web-2_10.0.0.2_8080", "web-2"
			h.store.put(other)
		})
		h.start()
		h.wrote("-10.0.0.3:8080")
		h.awaitIdle(1)
		h.stop()
		h.quiet()
		if got := ids(h.store.instances()); len(got) != 2 {
			t.Errorf("Consul holds %v", got)
		}
	})
}

func TestRunStop(t *testing.T) {
	tests := []struct {
		name         string
		drainTimeout time.Duration
		pending      bool
		want         []string // the drain flush's change
	}{
		{name: "pending change, DrainTimeout set: final flush", drainTimeout: 5 * time.Second, pending: true, want: []string{"+10.0.0.2:8080"}},
		{name: "pending change, DrainTimeout 0: no final flush", pending: true},
		{name: "nothing pending, DrainTimeout set: no flush", drainTimeout: 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(_ *harness, o *Options) { o.DrainTimeout = tt.drainTimeout })
			h.start()
			h.wrote("+10.0.0.1:8080")
			h.awaitIdle(1)
			if tt.pending {
				h.clk.Step(W / 2)
				h.notify(addEndpoint(epB))
				h.awaitTimer()
			}
			if err := h.stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			applies := h.store.appliesCopy()
			if len(applies) != 1+len(tt.want) {
				t.Fatalf("%d applies, want %d", len(applies), 1+len(tt.want))
			}
			if tt.want != nil {
				wantChange(t, applies[1], tt.want...)
				if err := h.store.ctxErrs[1]; err != nil {
					t.Errorf("final flush ran with a dead context: %v", err)
				}
				if f := h.flush(); f.Err != nil || !f.Wrote {
					t.Errorf("final flush: %+v", f)
				}
				<-h.store.applied
			}
			h.quiet()
		})
	}

	t.Run("stopped during a write, DrainTimeout set: one final attempt", func(t *testing.T) {
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(_ *harness, o *Options) { o.DrainTimeout = 5 * time.Second })
		h.store.blockNext()
		h.start()
		h.apply()
		h.awaitBlocked()
		h.cancel() // the blocked Apply returns the context's error
		if err := h.wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if f := h.flush(); !errors.Is(f.Err, context.Canceled) {
			t.Errorf("interrupted flush: %+v", f)
		}
		h.wrote("+10.0.0.1:8080")
		h.quiet()
		wantApplies(t, h, 2)
		if h.store.ctxErrs[1] != nil {
			t.Errorf("final attempt with a dead context")
		}
		h.converged()
	})

	t.Run("stopped before the gate opens", func(t *testing.T) {
		gate := make(chan struct{})
		h := newHarness(t, newSvc([]k8s.Endpoint{epA}), func(_ *harness, o *Options) {
			o.Gate = gate
			o.DrainTimeout = time.Second
		})
		h.start()
		h.awaitGate()
		h.notify(nil)
		if err := h.stop(); err != nil {
			t.Fatal(err)
		}
		h.quiet()
		if h.k8s.calls != 0 {
			t.Errorf("%d lookups", h.k8s.calls)
		}
	})
}

func TestRunFinished(t *testing.T) {
	tests := []struct {
		name   string
		change func(*fakeK8s)
		fail   int
	}{
		{name: "not selected any more", change: func(k *fakeK8s) { k.deselect() }},
		{name: "Service deleted", change: func(k *fakeK8s) { k.set(nil, false) }},
		{name: "deselected with unusable annotations", change: func(k *fakeK8s) {
			k.update(func(s *k8s.Service) { s.Annotations[AnnotationPort] = "nope!" })
			k.deselect()
		}},
		{name: "deregistration fails first", change: func(k *fakeK8s) { k.set(nil, false) }, fail: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), nil)
			h.start()
			h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
			h.awaitIdle(1)

			h.clk.Step(W)
			h.store.failNext(tt.fail, errTransient)
			tt.change(h.k8s)
			h.w.Notify()
			for i := 0; i < tt.fail; i++ {
				wantChange(t, h.apply(), "-10.0.0.1:8080", "-10.0.0.2:8080")
				if f := h.flush(); f.Err == nil {
					t.Fatal("flush did not fail")
				}
				h.stepFire(W)
			}
			h.wrote("-10.0.0.1:8080", "-10.0.0.2:8080")
			if err := h.wait(); !errors.Is(err, ErrFinished) {
				t.Fatalf("Run returned %v, want ErrFinished", err)
			}
			h.quiet()
			wantApplies(t, h, 2+tt.fail)
			if got := h.store.instances(); len(got) != 0 {
				t.Errorf("left in Consul: %v", ids(got))
			}
		})
	}

	t.Run("never selected, nothing owned", func(t *testing.T) {
		h := newHarness(t, nil, func(h *harness, _ *Options) { h.k8s.selected = false })
		h.start()
		if err := h.wait(); !errors.Is(err, ErrFinished) {
			t.Fatalf("Run returned %v, want ErrFinished", err)
		}
		if f := h.flush(); f.Wrote || f.Err != nil {
			t.Errorf("flush %+v", f)
		}
		h.quiet()
		wantApplies(t, h, 0)
	})
}

func TestRunInvalid(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA}), nil)
	h.start()
	h.wrote("+10.0.0.1:8080")
	h.awaitIdle(1)

	h.clk.Step(W)
	h.notify(func(s *k8s.Service) {
		s.Annotations[AnnotationPort] = "70000"
		s.Endpoints = append(s.Endpoints, epB)
	})
	if f := h.flush(); f.Wrote || f.Err != nil {
		t.Fatalf("flush of an invalid Service: %+v", f)
	}
	st := h.awaitIdle(2)
	if st.State != StateInvalid || !strings.Contains(st.LastError, AnnotationPort) || st.Desired != 1 || st.Registered != 1 {
		t.Errorf("status %+v", st)
	}
	ws := h.rep.got()
	if len(ws) != 1 || ws[0].reason != ReasonInvalidAnnotation ||
		!strings.Contains(ws[0].msg, "shop/web") || !strings.Contains(ws[0].msg, AnnotationPort) {
		t.Fatalf("warnings %+v, want one naming shop/web and %s", ws, AnnotationPort)
	}

	// Still invalid: not reported again, nothing written, state kept.
	h.clk.Step(W)
	h.notify(addEndpoint(epC))
	h.flush()
	if st := h.awaitIdle(3); st.State != StateInvalid {
		t.Errorf("state %q, want %q", st.State, StateInvalid)
	}
	if ws := h.rep.got(); len(ws) != 1 {
		t.Errorf("reported again: %+v", ws)
	}
	h.holds([]consul.Instance{passing(epA, 8080)}) // left as it was

	// Fixed: synced.
	h.clk.Step(W)
	h.notify(func(s *k8s.Service) { delete(s.Annotations, AnnotationPort) })
	h.wrote("+10.0.0.2:8080", "+10.0.0.3:8080")
	if st := h.awaitIdle(4); st.State != StateIdle || st.LastError != "" || st.Desired != 3 {
		t.Errorf("status after the fix: %+v", st)
	}
	h.stop()
	h.quiet()
	wantApplies(t, h, 2)
	h.converged()
}

// TestRunInvalidFromStart: a Service whose annotations are unusable when
// its worker starts leaves its instances as they are.
func TestRunInvalidFromStart(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}, withAnn(AnnotationSync, "ja")), func(h *harness, o *Options) {
		o.OwnedKnown = false
		h.store.put(passing(epA, 8080))
	})
	h.start()
	if f := h.flush(); f.Wrote || f.Err != nil {
		t.Fatalf("flush %+v", f)
	}
	if st := h.awaitIdle(1); st.State != StateInvalid || !strings.Contains(st.LastError, AnnotationSync) {
		t.Errorf("status %+v", st)
	}
	h.stop()
	h.quiet()
	wantApplies(t, h, 0)
	h.holds([]consul.Instance{passing(epA, 8080)})
}

func TestRunReportsOnce(t *testing.T) {
	problem := "EndpointSlice shop/web-x: endpoint 3: no addresses, skipped"
	noMetrics := k8s.Endpoint{Address: "10.0.0.6", Ports: map[string]int32{"http": 8080}, Ready: true}
	noMetrics2 := k8s.Endpoint{Address: "10.0.0.7", Ports: map[string]int32{"http": 8080}, Ready: true}
	svc := newSvc([]k8s.Endpoint{epA, noMetrics, noMetrics2}, withAnn(AnnotationPort, "metrics"))
	svc.Problems = []string{problem}
	h := newHarness(t, svc, nil)
	h.start()
	h.wrote("+10.0.0.1:9100")
	h.awaitIdle(1)
	if ws := h.rep.got(); len(ws) != 3 || ws[2] != (warning{ReasonEndpointSkipped, problem}) {
		t.Fatalf("warnings %+v, want 2 skipped endpoints and the problem", ws)
	}

	// Another look with the same problems: nothing reported.
	h.clk.Step(W)
	h.notify(tags("x"))
	h.wrote("~10.0.0.1:9100[k8s x east]")
	h.awaitIdle(2)
	if ws := h.rep.got(); len(ws) != 3 {
		t.Errorf("reported again: %+v", ws[3:])
	}

	// The problem goes away and comes back: reported again.
	h.clk.Step(W)
	h.notify(func(s *k8s.Service) { s.Problems = nil })
	h.flush()
	h.awaitIdle(3)
	h.clk.Step(W)
	h.notify(func(s *k8s.Service) { s.Problems = []string{problem} })
	h.flush()
	h.awaitIdle(4)
	if ws := h.rep.got(); len(ws) != 4 || ws[3] != (warning{ReasonEndpointSkipped, problem}) {
		t.Errorf("warnings %+v, want the problem reported again", ws)
	}
	h.stop()
	h.quiet()
	wantApplies(t, h, 2)
}

func TestRunPanic(t *testing.T) {
	tests := []struct {
		name  string
		svc   *k8s.Service
		setup func(*harness)
		what  string // the panic's value, kept as it is
		frame string // where it happened, in its stack
	}{
		{name: "in Lookup", svc: newSvc([]k8s.Endpoint{epA}), setup: func(h *harness) { h.k8s.panics = 1 }, what: "lookup exploded", frame: "(*fakeK8s).lookup"},
		{name: "in Reporter", svc: newSvc([]k8s.Endpoint{epA}, withAnn(AnnotationWindow, "x")), setup: func(h *harness) { h.rep.panics = 1 }, what: "reporter exploded", frame: "Warning"},
		{name: "in Store.Apply", svc: newSvc([]k8s.Endpoint{epA}), setup: func(h *harness) { h.store.panics = 1 }, what: "store exploded", frame: "(*fakeStore).Apply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.svc, nil)
			tt.setup(h)
			h.start()
			f := h.flush()
			var pe *PanicError
			if !errors.As(f.Err, &pe) || pe.Value != tt.what || !strings.Contains(pe.Stack, tt.frame) {
				t.Fatalf("flush error %#v, want a PanicError of value %q and a stack through %s", f.Err, tt.what, tt.frame)
			}
			if st := h.w.Status(); st.State != StateBackingOff || !strings.Contains(st.LastError, "panicked") {
				t.Errorf("status %+v", st)
			}
			h.stepNotFired(W - 1)
			h.stepFire(1)
			if strings.Contains(tt.name, "Apply") {
				h.apply() // the one that panicked
			}
			h.wrote("+10.0.0.1:8080")
			h.awaitIdle(2)
			h.stop()
			h.quiet()
			h.converged()
		})
	}
}

func TestStatusAndObserver(t *testing.T) {
	h := newHarness(t, newSvc([]k8s.Endpoint{epA, epB}), nil)
	if st := h.w.Status(); st.State != StateWaiting || st.Namespace != testNS || st.Service != testName || st.Window != W {
		t.Errorf("status before Run: %+v", st)
	}
	h.start()
	f := h.wrote("+10.0.0.1:8080", "+10.0.0.2:8080")
	if f.Applied.Registered != 2 || f.Applied.Txns != 1 || f.Desired != 2 || f.Registered != 2 || f.Window != W || f.Coalesced != 0 || f.Latency != 0 {
		t.Errorf("flush %+v", f)
	}
	h.awaitIdle(1)
	h.clk.Step(W / 2)
	h.notify(nil)
	h.notify(nil)
	h.awaitTimer()
	st := h.w.Status()
	if st.State != StatePending || !st.Pending || st.Events != 2 {
		t.Errorf("status with a change pending: %+v", st)
	}
	h.stepFire(W / 2)
	if f := h.flush(); f.Wrote || f.Coalesced != 2 {
		t.Errorf("flush with nothing to write: %+v", f)
	}
	st = h.awaitIdle(2)
	if st.Desired != 2 || st.Registered != 2 || st.Events != 2 || st.LastError != "" {
		t.Errorf("status %+v", st)
	}
	h.stop()
	h.quiet()
	if events, _, flushes := h.obs.snapshot(); events != 2 || len(flushes) != 2 {
		t.Errorf("observer saw %d events, %d flushes", events, len(flushes))
	}
}

func TestNewDefaults(t *testing.T) {
	w := New(Options{Key: testKey, Config: testConfig(t), Lookup: func() (*k8s.Service, bool) { return nil, false }})
	if w.opts.MinBackoff != 200*time.Millisecond || w.opts.MaxBackoff != 30*time.Second || w.clock == nil || w.log == nil {
		t.Errorf("defaults: %+v", w.opts)
	}
	if w.Key() != testKey {
		t.Errorf("Key() = %v", w.Key())
	}
}

// panickingObserver panics when told of a flush (outside sync's recover).
type panickingObserver struct{ fakeObserver }

func (o *panickingObserver) Flushed(Flush) { panic("observer broke") }

// TestPanicInAFlushReachesRunsCaller: the flush runs on a goroutine of its
// own (flushAside); a panic there outside sync's own recover is raised
// again on Run's goroutine, where the supervisor's recover catches it, as
// a *PanicError with the original value and the flush's stack.
func TestPanicInAFlushReachesRunsCaller(t *testing.T) {
	w := New(Options{Key: testKey, Config: testConfig(t), Lookup: (&fakeK8s{svc: newSvc([]k8s.Endpoint{epA}), selected: true}).lookup,
		Store: newFakeStore(t, testCluster(t)), OwnedKnown: true, Observer: &panickingObserver{}})
	got := make(chan any, 1)
	go func() {
		defer func() { got <- recover() }()
		_ = w.Run(t.Context())
	}()
	p := <-got
	pe, _ := p.(*PanicError)
	if pe == nil || pe.Value != "observer broke" || !strings.Contains(pe.Stack, "(*Worker).record") {
		t.Fatalf("Run's caller recovered %#v, want a *PanicError with the observer's value and the flush's stack", p)
	}
}
