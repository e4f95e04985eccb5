package watch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
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
	a, err := api.NewClient(&api.Config{Address: strings.TrimPrefix(srv.URL, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	var full atomic.Int64
	c := New(a, Options{MaxWatches: 1, PollEvery: 3 * time.Second, Clock: clk, Full: func() { full.Add(1) }})
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

// TestNoCapBlocksAlways: without MaxWatches every query blocks.
func TestNoCapBlocksAlways(t *testing.T) {
	var indexed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") != "" {
			indexed.Add(1)
		}
		w.Header().Set("X-Consul-Index", "9")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	a, err := api.NewClient(&api.Config{Address: strings.TrimPrefix(srv.URL, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	c := New(a, Options{})
	for range 3 {
		if _, _, err := c.Health(context.Background(), "a", 5); err != nil {
			t.Fatal(err)
		}
	}
	if indexed.Load() != 3 || c.Stats() != (WatchStats{}) {
		t.Fatalf("%d indexed queries, stats %+v; want 3 and none", indexed.Load(), c.Stats())
	}
}
