package watch

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestNudgeWhileReadingReadsAgain: two pollers of one Consul name (two
// units with different tags) that the feed nudges while they read both
// read again before they return, since the answer each has may predate
// the change; neither takes the other's nudge, and none is left for a
// later wait.
func TestNudgeWhileReadingReadsAgain(t *testing.T) {
	stop, release := make(chan struct{}), make(chan struct{})
	inRead := make(chan string, 4)
	var mu sync.Mutex
	reads := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") != "" { // the watched service holds the slot
			select {
			case <-stop:
			case <-r.Context().Done():
			}
			return
		}
		tag := r.URL.Query().Get("tag")
		mu.Lock()
		reads[tag]++
		n := reads[tag]
		mu.Unlock()
		if n == 1 {
			inRead <- tag
			select {
			case <-release:
			case <-stop:
				return
			}
		}
		w.Header().Set("X-Consul-Index", strconv.Itoa(7+n))
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	defer close(stop)
	c, clk := slotHeld(t, srv, "watched", Options{PollEvery: time.Hour, Jitter: func() float64 { return 0.5 }})
	ctx := t.Context()
	deadline := time.Now().Add(10 * time.Second)
	type answer struct {
		index uint64
		err   error
	}
	poll := func(tag string) chan answer {
		done := make(chan answer, 1)
		go func() { _, idx, err := c.HealthQuery(ctx, "b", Query{Tag: tag}, 5); done <- answer{idx, err} }()
		return done
	}
	x, y := poll("x"), poll("y")
	for c.Stats().Polling != 2 || clk.Waiters() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("pollers waiting: %+v", c.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	b := map[string]struct{}{"b": {}}
	c.slots.nudge(b) // both read at once
	for range 2 {
		select {
		case <-inRead:
		case <-time.After(10 * time.Second):
			t.Fatalf("b not read after a nudge (stats %+v)", c.Stats())
		}
	}
	c.slots.nudge(b) // while both read
	close(release)
	for tag, done := range map[string]chan answer{"x": x, "y": y} {
		select {
		case got := <-done:
			if got.err != nil || got.index != 9 {
				t.Errorf("poller of tag %s: index %d, %v; want 9 (its second read)", tag, got.index, got.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("poller of tag %s did not return", tag)
		}
	}
	if s := c.Stats(); s.Polls != 4 || s.Nudged != 4 {
		t.Errorf("stats %+v, want 4 polls, all nudged", s)
	}
}

// slotHeld returns a Client of srv with opts (MaxWatches 1, a fake clock)
// once a blocking query on service name holds its one slot; srv must hold
// the queries that carry an index.
func slotHeld(t *testing.T, srv *httptest.Server, name string, opts Options) (*Client, *clocktesting.FakeClock) {
	t.Helper()
	a := apiOf(t, srv)
	clk := clocktesting.NewFakeClock(time.Now())
	opts.MaxWatches, opts.Clock = 1, clk
	c := New(a, opts)
	go func() { _, _, _ = c.Health(t.Context(), name, 5) }()
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Blocking != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not take the slot", name)
		}
		time.Sleep(time.Millisecond) // no event to await: the stats are the signal
	}
	return c, clk
}

// TestFeedNodeReadsStopAtAFailure: when the checks of many nodes change
// (an outage) and Consul fails the read of a node's services, the feed
// reads no other node of that answer (each would fail too, up to
// ReadTimeout each, and the feed would read nothing new meanwhile), and
// FeedError counts the answers that failed so in a row, so that the
// daemon's log thins out.
func TestFeedNodeReadsStopAtAFailure(t *testing.T) {
	var nodeReads atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nodeReads.Add(1)
		http.Error(w, "rpc error: no leader", http.StatusInternalServerError)
	}))
	defer srv.Close()
	a := apiOf(t, srv)
	var failures []int
	c := New(a, Options{MaxWatches: 1, FeedError: func(_ error, n int) { failures = append(failures, n) }})
	f := &feed{c: c, state: api.HealthCritical}
	nodes := func(modify uint64) []*api.HealthCheck {
		var out []*api.HealthCheck
		for i := range 50 {
			out = append(out, &api.HealthCheck{Node: "n" + strconv.Itoa(i), CheckID: "serfHealth", Status: "critical", ModifyIndex: modify})
		}
		return out
	}
	f.deliver(t.Context(), nil)
	f.deliver(t.Context(), nodes(10))
	f.deliver(t.Context(), nodes(11))
	if n := nodeReads.Load(); n != 2 {
		t.Errorf("%d node reads for two answers that Consul failed, want 2 (one each)", n)
	}
	if !slices.Equal(failures, []int{1, 2}) {
		t.Errorf("FeedError told failures %v, want [1 2]", failures)
	}
}
