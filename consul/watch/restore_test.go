package watch

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// restoringConsul answers the catalog and one service's health the way
// Consul 1.14 does around a snapshot restore: a blocking catalog query at
// the current index is held until restore, then returns at once with that
// old index (the abandoned state's); one at a higher index (after the
// restore) is held until its request ends, and so is a blocking health
// query at the current index or higher (the streaming backend is not woken
// by a restore); a read at index 0 answers the current index.
type restoringConsul struct {
	// held, when set, runs before a held catalog query returns.
	held            func()
	mu              sync.Mutex
	catalog, health uint64
	restored        chan struct{} // closed by restore
	catalogAsked    chan uint64   // the index of every catalog query
	healthAsked     chan uint64   // the index of every health query
}

func newRestoringConsul(catalog, health uint64) *restoringConsul {
	return &restoringConsul{catalog: catalog, health: health, restored: make(chan struct{}),
		catalogAsked: make(chan uint64, 16), healthAsked: make(chan uint64, 16)}
}

func (s *restoringConsul) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	index, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	s.mu.Lock()
	catalog, health := s.catalog, s.health
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/catalog/services":
		s.catalogAsked <- index
		switch {
		case index != 0 && index == catalog:
			select {
			case <-s.restored:
			case <-r.Context().Done():
				return
			}
			s.mu.Lock()
			held := s.held
			s.mu.Unlock()
			if held != nil {
				held()
			}
		case index > catalog:
			<-r.Context().Done()
			return
		}
		w.Header().Set("X-Consul-Index", fmt.Sprint(catalog))
		_, _ = w.Write([]byte(`{"web":[]}`))
	case "/v1/health/service/web":
		s.healthAsked <- index
		if index != 0 && index >= health {
			<-r.Context().Done()
			return
		}
		w.Header().Set("X-Consul-Index", fmt.Sprint(health))
		_, _ = w.Write([]byte("[]"))
	default:
		http.NotFound(w, r)
	}
}

// restore takes the indexes back, as a restore of an older snapshot does,
// and wakes the catalog query held.
func (s *restoringConsul) restore(catalog, health uint64) {
	s.mu.Lock()
	s.catalog, s.health = catalog, health
	s.mu.Unlock()
	close(s.restored)
}

// TestRestoreFoundReadsAgain: the catalog query returns with its old index
// (a restore woke it); the read from scratch from the leader that checks
// it finds the index gone back: a restore, told once. The health query
// in flight (which Consul holds on) is aborted and reads from scratch;
// one that begins within restoreWindow with an index from before the
// restore reads from scratch first, and blocks at once on an index that
// is still current; after the window, queries block on their index.
func TestRestoreFoundReadsAgain(t *testing.T) {
	s := newRestoringConsul(35, 31)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close) // after t.Context() ends, which ends the queries held
	a := apiOf(t, srv)
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	found := 0
	c := New(a, Options{Wait: time.Minute, MaxStale: -1, Clock: clk, Restored: func() { found++ }})
	ctx := t.Context()
	if _, idx, err := c.Services(ctx, 0); err != nil || idx != 35 {
		t.Fatalf("first catalog read: %d, %v", idx, err)
	}
	<-s.catalogAsked
	type answer struct {
		index uint64
		err   error
	}
	asked := func(n int) []uint64 {
		t.Helper()
		var out []uint64
		for range n {
			select {
			case i := <-s.healthAsked:
				out = append(out, i)
			case <-time.After(10 * time.Second):
				t.Fatalf("health queries asked: %v; want %d", out, n)
			}
		}
		return out
	}
	// result is a query's answer; a query that does not return is the
	// failure of a rule that should have ended it.
	result := func(ch chan answer, what string) answer {
		t.Helper()
		select {
		case a := <-ch:
			return a
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer after 10s", what)
			return answer{}
		}
	}
	health := func(ctx context.Context, index uint64) chan answer {
		ch := make(chan answer, 1)
		go func() {
			_, idx, err := c.Health(ctx, "web", index)
			ch <- answer{idx, err}
		}()
		return ch
	}

	inFlight := health(ctx, 31)
	if got := asked(1); got[0] != 31 {
		t.Fatalf("health query asked at %v, want 31", got)
	}
	catalog := make(chan answer, 1)
	go func() {
		_, idx, err := c.Services(ctx, 35)
		catalog <- answer{idx, err}
	}()
	if i := <-s.catalogAsked; i != 35 {
		t.Fatalf("catalog query asked at %d, want 35", i)
	}
	s.restore(23, 19)
	if a := result(catalog, "catalog query across the restore"); a.err != nil || a.index != 23 {
		t.Fatalf("catalog query across the restore: %d, %v; want the restored index 23", a.index, a.err)
	}
	if i := <-s.catalogAsked; i != 0 {
		t.Fatalf("catalog query checked at %d, want 0", i)
	}
	if a := result(inFlight, "health query in flight across the restore"); a.err != nil || a.index != 19 {
		t.Fatalf("health query in flight across the restore: %d, %v; want the restored index 19", a.index, a.err)
	}
	if got := asked(1); got[0] != 0 || found != 1 {
		t.Fatalf("health asked again at %v, restores found %d; want [0] and 1", got, found)
	}

	// Within the window: an index from before the restore is read from
	// scratch; a current one blocks after that read.
	if a := result(health(ctx, 31), "health query with an old index within the window"); a.err != nil || a.index != 19 {
		t.Fatalf("health query with an old index within the window: %d, %v; want 19", a.index, a.err)
	}
	if got := asked(1); got[0] != 0 {
		t.Fatalf("health query with an old index within the window asked %v, want [0]", got)
	}
	qctx, cancel := context.WithCancel(ctx)
	blocked := health(qctx, 19)
	if got := asked(2); !slices.Equal(got, []uint64{0, 19}) {
		t.Fatalf("health query with the current index within the window asked %v, want [0 19]", got)
	}
	cancel()
	<-blocked

	clk.Step(restoreWindow)
	qctx, cancel = context.WithCancel(ctx)
	blocked = health(qctx, 19)
	if got := asked(1); got[0] != 19 {
		t.Fatalf("health query after the window asked %v, want [19]", got)
	}
	cancel()
	<-blocked
	if found != 1 {
		t.Fatalf("restores found %d, want 1", found)
	}
}

// TestNoRestoreOnAWaitPassed: a catalog query whose wait passed returns
// its index unchanged; the leader's read finds the same index: no
// restore, and a health query in flight stays. The same return before
// half the wait is a restore that left the catalog's index as it was.
func TestNoRestoreOnAWaitPassed(t *testing.T) {
	s := newRestoringConsul(35, 31)
	close(s.restored) // every catalog query returns at once: its wait passed
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	s.held = func() { clk.Step(time.Minute) }
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close) // after t.Context() ends, which ends the queries held
	a := apiOf(t, srv)
	found := 0
	c := New(a, Options{Wait: time.Minute, MaxStale: -1, Clock: clk, Restored: func() { found++ }})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, _, err := c.Health(ctx, "web", 31); done <- err }()
	if i := <-s.healthAsked; i != 31 {
		t.Fatalf("health query asked at %d, want 31", i)
	}
	for range 3 {
		if _, idx, err := c.Services(ctx, 35); err != nil || idx != 35 {
			t.Fatalf("catalog query: %d, %v; want 35", idx, err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("health query ended: %v", err)
	default:
	}
	if found != 0 {
		t.Fatalf("restores found %d, want 0", found)
	}

	s.mu.Lock()
	s.held = nil // the next return comes at once: a restore woke it
	s.mu.Unlock()
	if _, idx, err := c.Services(ctx, 35); err != nil || idx != 35 || found != 1 {
		t.Fatalf("catalog query: %d, %v, restores found %d; want 35 and 1", idx, err, found)
	}
	// The health query in flight reads from scratch, finds its index
	// unchanged and blocks on it again.
	for _, want := range []uint64{0, 31} {
		select {
		case i := <-s.healthAsked:
			if i != want {
				t.Fatalf("health asked again at %d, want %d", i, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("health query not asked again at %d after the early return", want)
		}
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("health query ended without its context's error")
	}
}
