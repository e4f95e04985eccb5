package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
)

// flakyReads is a Store whose node reads fail the first fails times; it
// implements nothing else (the embedded Store is nil).
type flakyReads struct {
	Store
	mu    sync.Mutex
	fails int
	reads int
}

func (f *flakyReads) ReadNode(context.Context) ([]consul.Registered, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.reads <= f.fails {
		return nil, errors.New("connection refused")
	}
	return nil, nil
}

func (f *flakyReads) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// TestReadOwnedBacksOff: the bootstrap read is retried after 200ms,
// 400ms, 800ms... (each jittered to 80-120%), on the injected clock.
func TestReadOwnedBacksOff(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	store := &flakyReads{fails: 4}
	s := New(Options{Store: store, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.readOwned(ctx)
		done <- err
	}()
	await := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	for i, base := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond} {
		await("a failed read and its retry timer", func() bool { return store.count() == i+1 && clk.HasWaiters() })
		lo, hi := base*8/10, base*12/10
		clk.Step(lo - time.Nanosecond)
		if !clk.HasWaiters() || store.count() != i+1 {
			t.Fatalf("retry %d came before %v (80%% of %v)", i+1, lo, base)
		}
		clk.Step(hi - lo)
		// The retry comes at hi at the latest: its read happens without
		// another step of the clock (the next timer may already wait).
		await(fmt.Sprintf("retry %d by %v (120%% of %v)", i+1, hi, base), func() bool { return store.count() == i+2 })
	}
	select {
	case err := <-done:
		if err != nil || store.count() != 5 {
			t.Fatalf("readOwned: %v after %d reads, want nil after 5", err, store.count())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("readOwned did not return after the reads succeeded")
	}
}

// TestRestartBackoff: a crashed worker is restarted after 1s, 2s, 4s, 8s,
// 16s, then every 30s (each jittered to 80-120%).
func TestRestartBackoff(t *testing.T) {
	for n, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		for range 100 {
			if d := restartBackoff.Delay(n + 1); d < base*8/10 || d >= base*12/10 {
				t.Fatalf("restart %d after %v, want %v +-20%%", n+1, d, base)
			}
		}
	}
	if d := restartBackoff.Delay(1000); d < 24*time.Second || d >= 36*time.Second {
		t.Errorf("restart 1000 after %v, want 30s +-20%%", d)
	}
}
