package watch

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestMaxWatchesPollsPastTheCap: with one slot, a second blocking health
// query does not block on Consul: it waits PollEvery on the clock and reads
// the current state at once (no index); the first keeps its blocking
// query; once the slot is free the next query blocks again.
func TestMaxWatchesPollsPastTheCap(t *testing.T) {
	release, stop := make(chan struct{}), make(chan struct{})
	blocking := make(chan string, 4)
	var plain atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/health/service/") {
			http.NotFound(w, r)
			return
		}
		if r.URL.Query().Get("index") != "" {
			blocking <- r.URL.Path
			select {
			case <-release:
			case <-stop:
				return
			case <-r.Context().Done():
				return
			}
		} else {
			plain.Add(1)
		}
		w.Header().Set("X-Consul-Index", "7")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	defer close(stop) // before Close, which waits for the handlers
	a := apiOf(t, srv)
	clk := clocktesting.NewFakeClock(time.Now())
	var full atomic.Int64
	c := New(a, Options{MaxWatches: 1, PollEvery: 3 * time.Second, Clock: clk, Full: func() { full.Add(1) }, Jitter: func() float64 { return 0.5 }})
	ctx := t.Context()

	first := make(chan error, 1)
	go func() { _, _, err := c.Health(ctx, "a", 5); first <- err }()
	if got := <-blocking; got != "/v1/health/service/a" {
		t.Fatalf("blocking query on %s, want service a", got)
	}
	second := make(chan uint64, 1)
	go func() {
		_, idx, err := c.Health(ctx, "b", 5)
		if err != nil {
			t.Error(err)
		}
		second <- idx
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() { // the poller's timer is the event; the fake clock has no channel for it
		if time.Now().After(deadline) {
			t.Fatalf("the second query did not wait for its poll (stats %+v)", c.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if s := c.Stats(); s.Blocking != 1 || s.Polling != 1 || s.Max != 1 || full.Load() != 1 {
		t.Fatalf("stats %+v, full told %d times; want 1 blocking, 1 polling, told once", s, full.Load())
	}
	if plain.Load() != 0 {
		t.Fatalf("%d reads before the poll interval passed", plain.Load())
	}
	clk.Step(3 * time.Second)
	if idx := <-second; idx != 7 || plain.Load() != 1 {
		t.Fatalf("poll: index %d, %d plain reads; want 7 and 1", idx, plain.Load())
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The slot is free again: the next query blocks.
	release = make(chan struct{})
	close(release)
	if _, _, err := c.Health(ctx, "b", 7); err != nil {
		t.Fatal(err)
	}
	if got := <-blocking; got != "/v1/health/service/b" {
		t.Fatalf("after the slot freed: blocking query on %s, want b", got)
	}
	if s := c.Stats(); s.Blocking != 0 || s.Polling != 0 || s.Polls != 1 {
		t.Fatalf("stats at the end %+v, want nothing in flight and 1 poll", s)
	}
}

// TestNoCapBlocksAlways: without MaxWatches every query blocks, and Stats
// counts the blocking queries in flight (a first read at index 0 does not
// block).
func TestNoCapBlocksAlways(t *testing.T) {
	var indexed atomic.Int64
	held, release, stop := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") != "" {
			if indexed.Add(1) == 1 {
				held <- struct{}{}
				select {
				case <-release:
				case <-stop:
					return
				}
			}
		}
		w.Header().Set("X-Consul-Index", "9")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	defer close(stop) // before Close, which waits for the handlers
	a := apiOf(t, srv)
	c := New(a, Options{})
	first := make(chan error, 1)
	go func() { _, _, err := c.Health(t.Context(), "a", 5); first <- err }()
	<-held
	if s := c.Stats(); s != (WatchStats{Blocking: 1}) {
		t.Fatalf("stats %+v while one query blocks, want Blocking 1 and nothing else", s)
	}
	if _, _, err := c.Health(t.Context(), "b", 0); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s != (WatchStats{Blocking: 1}) {
		t.Fatalf("stats %+v after a read at index 0, want Blocking 1", s)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, _, err := c.Health(t.Context(), "a", 5); err != nil {
			t.Fatal(err)
		}
	}
	if indexed.Load() != 3 || c.Stats() != (WatchStats{}) {
		t.Fatalf("%d indexed queries, stats %+v; want 3 and none in flight", indexed.Load(), c.Stats())
	}
}

// TestPollsReadAFewAtATime: past the cap, polls of workers started
// together hold at most max(8, MaxWatches/16) connections at once, and
// the rest wait for one of them to end.
func TestPollsReadAFewAtATime(t *testing.T) {
	hold, stop := make(chan struct{}), make(chan struct{})
	var inFlight, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") != "" {
			<-stop // the one blocking query holds the slot
			return
		}
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		select {
		case <-hold:
		case <-stop:
		}
		inFlight.Add(-1)
		w.Header().Set("X-Consul-Index", "7")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	defer close(stop)
	c, clk := slotHeld(t, srv, "watched", Options{PollEvery: time.Second, Jitter: func() float64 { return 0 }})
	ctx := t.Context()
	deadline := time.Now().Add(10 * time.Second)
	const pollers = 12
	done := make(chan error, pollers)
	for i := range pollers {
		go func() { _, _, err := c.Health(ctx, fmt.Sprintf("p%d", i), 5); done <- err }()
	}
	// Polling counts a poller before its timer exists: the timers are
	// the event (a step before one exists would leave it an hour away).
	for c.Stats().Polling != pollers || clk.Waiters() != pollers {
		if time.Now().After(deadline) {
			t.Fatalf("pollers waiting: %+v, %d timers", c.Stats(), clk.Waiters())
		}
		time.Sleep(time.Millisecond)
	}
	clk.Step(time.Second) // every poller's timer at once (jitter 0: 80 % of a second)
	for inFlight.Load() != 8 {
		if time.Now().After(deadline) {
			t.Fatalf("%d polls reading, want 8", inFlight.Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(hold)
	for range pollers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if p := peak.Load(); p != 8 {
		t.Fatalf("at most %d polls read at once, want 8", p)
	}
}

// TestFirstReadsReadAFewAtATime: reads at index 0 (workers starting
// together, or reading again after an error) take the polls' reads, so
// they too hold at most max(8, MaxWatches/16) connections at once.
func TestFirstReadsReadAFewAtATime(t *testing.T) {
	hold := make(chan struct{})
	var inFlight, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-hold
		inFlight.Add(-1)
		w.Header().Set("X-Consul-Index", "7")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	a := apiOf(t, srv)
	c := New(a, Options{MaxWatches: 1})
	const workers = 12
	done := make(chan error, workers)
	for i := range workers {
		go func() { _, _, err := c.Health(t.Context(), fmt.Sprintf("s%d", i), 0); done <- err }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for inFlight.Load() != 8 {
		if time.Now().After(deadline) {
			close(hold)
			t.Fatalf("%d first reads reading, want 8", inFlight.Load())
		}
		time.Sleep(time.Millisecond) // no event to await: the server's count is the signal
	}
	close(hold)
	for range workers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if p := peak.Load(); p != 8 {
		t.Fatalf("at most %d first reads at once, want 8", p)
	}
	if s := c.Stats(); s.Polls != 0 {
		t.Fatalf("stats %+v: first reads counted as polls", s)
	}
}
