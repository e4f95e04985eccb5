package shard

import (
	"bytes"
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// fakeFleet is the supervisor's side as the Manager sees it: the shards it
// was told it holds.
type fakeFleet struct {
	bootstrap chan struct{}
	mu        sync.Mutex
	held      map[int]bool
	gained    int
	conflicts int
}

// newFleet returns a bootstrapped fleet and a context that ends with the
// test.
func newFleet(t *testing.T) (*fakeFleet, context.Context) {
	f := &fakeFleet{bootstrap: make(chan struct{}), held: map[int]bool{}}
	close(f.bootstrap)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return f, ctx
}

func (f *fakeFleet) BootstrapDone() <-chan struct{} { return f.bootstrap }

func (f *fakeFleet) GainShard(_ context.Context, k int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[k] = true
	f.gained++
}

func (f *fakeFleet) LoseShard(k int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, k)
}

func (f *fakeFleet) ReplicaIDConflict() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conflicts++
}

// HeldShards returns the shards held, sorted.
func (f *fakeFleet) HeldShards() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []int{}
	for k := range f.held {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// waitFor polls cond until it holds, failing the test after 10 s.
func (f *fakeFleet) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, cond)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newClock() *clocktesting.FakeClock {
	return clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
}

// testConfig: replica "me", Leases in "leases", 15 s leases.
func testConfig(shards int) Config {
	return Config{Shards: shards, Namespace: "leases", ReplicaID: "me",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
}

// lockedBuffer is a log sink safe to read while the manager writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func mustReconcile(t *testing.T, m *Manager, ctx context.Context, renew bool) time.Time {
	t.Helper()
	next, err := m.reconcile(ctx, renew)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return next
}
