package watch

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeChecks is a Consul that serves the feed's queries
// (/v1/health/state/<state>) the way Consul does: the checks in that
// state; an index below the checks table's is answered at once, the
// current one blocks until a check in that state appears, changes or
// leaves (Consul's status index), not at other checks' changes.
type fakeChecks struct {
	mu      sync.Mutex
	index   uint64
	checks  []*api.HealthCheck
	changed map[string]chan struct{} // per state: closed and replaced when its checks change
	blocked chan string              // told every blocking feed query, with its state
	asked   []string                 // path?filter of every feed query
}

func newFakeChecks() *fakeChecks {
	return &fakeChecks{index: 1, changed: map[string]chan struct{}{}, blocked: make(chan string, 16)}
}

func (f *fakeChecks) inState(state string) []*api.HealthCheck {
	var out []*api.HealthCheck
	for _, c := range f.checks {
		if c.Status == state {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeChecks) set(checks ...*api.HealthCheck) {
	f.mu.Lock()
	defer f.mu.Unlock()
	before := map[string][]byte{}
	for state := range f.changed {
		before[state], _ = json.Marshal(f.inState(state))
	}
	f.index++
	f.checks = checks
	for state, ch := range f.changed {
		if now, _ := json.Marshal(f.inState(state)); string(now) != string(before[state]) {
			close(ch)
			f.changed[state] = make(chan struct{})
		}
	}
}

func (f *fakeChecks) serve(w http.ResponseWriter, r *http.Request, stop chan struct{}) {
	state := strings.TrimPrefix(r.URL.Path, "/v1/health/state/")
	idx, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	f.mu.Lock()
	f.asked = append(f.asked, r.URL.Path+"?"+r.URL.Query().Get("filter"))
	if f.changed[state] == nil {
		f.changed[state] = make(chan struct{})
	}
	if idx >= f.index {
		ch := f.changed[state]
		f.mu.Unlock()
		f.blocked <- state
		select {
		case <-ch:
		case <-stop:
			return
		case <-r.Context().Done():
			return
		}
		f.mu.Lock()
	}
	body, _ := json.Marshal(f.inState(state))
	w.Header().Set("X-Consul-Index", strconv.FormatUint(f.index, 10))
	f.mu.Unlock()
	_, _ = w.Write(body)
}

// TestFeedNudgesPollers: past the cap, a poller whose poll is an hour
// away reads its service as soon as the feed sees one of its checks not
// passing appear, change or leave, or a check of its node change; a
// nudge that comes while the poller reads makes it read again.
func TestFeedNudgesPollers(t *testing.T) {
	stop := make(chan struct{})
	feed := newFakeChecks()
	reads := make(chan string, 16)
	holdB := make(chan chan struct{}, 1) // a read of b waits on the channel sent here
	inRead := make(chan struct{}, 1)     // told when a read of b waits
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/v1/health/state/"):
			feed.serve(w, r, stop)
			return
		case r.URL.Path == "/v1/catalog/node-services/n2":
			_, _ = w.Write([]byte(`{"Node":{"Node":"n2"},"Services":[{"ID":"c1","Service":"c"}]}`))
			return
		case !strings.HasPrefix(r.URL.Path, "/v1/health/service/"):
			http.NotFound(w, r)
			return
		}
		name := strings.TrimPrefix(r.URL.Path, "/v1/health/service/")
		if r.URL.Query().Get("index") != "" { // the watched service holds the slot
			select {
			case <-stop:
			case <-r.Context().Done():
			}
			return
		}
		if name == "b" {
			select {
			case h := <-holdB:
				inRead <- struct{}{}
				select {
				case <-h:
				case <-stop:
					return
				}
			default:
			}
		}
		reads <- name
		w.Header().Set("X-Consul-Index", "7")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	defer close(stop)
	c, clk := slotHeld(t, srv, "a", Options{PollEvery: time.Hour, Jitter: func() float64 { return 0.5 }})
	ctx := t.Context()
	go c.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	poll := func(name string) chan error {
		done := make(chan error, 1)
		go func() { _, _, err := c.Health(ctx, name, 5); done <- err }()
		return done
	}
	// awaitFeed steps the fake clock past the feed's gap until the feed
	// blocks on Consul again.
	awaitFeed := func(states ...string) {
		t.Helper()
		for len(states) > 0 {
			select {
			case got := <-feed.blocked:
				states = slices.DeleteFunc(states, func(s string) bool { return s == got })
			case <-time.After(time.Millisecond):
				clk.Step(feedGap)
			}
			if time.Now().After(deadline) {
				t.Fatal("the feed did not block on Consul")
			}
		}
	}
	awaitRead := func(name string, done chan error) {
		t.Helper()
		select {
		case got := <-reads:
			if got != name {
				t.Fatalf("read %s, want %s", got, name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not read (stats %+v)", name, c.Stats())
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	b := poll("b")
	// The feed started with the first poll; its first answers are kept,
	// not compared.
	awaitFeed(api.HealthCritical, api.HealthWarning)
	check := func(node, id, svc, status string, modify uint64) *api.HealthCheck {
		return &api.HealthCheck{Node: node, CheckID: id, ServiceName: svc, Status: status, ModifyIndex: modify}
	}
	feed.set(check("n1", "b1", "b", "critical", 10))
	awaitRead("b", b)
	awaitFeed(api.HealthCritical)

	// A node check: the services on the node are read.
	cc := poll("c")
	for c.Stats().Polling != 1 {
		if time.Now().After(deadline) {
			t.Fatal("c is not polling")
		}
		time.Sleep(time.Millisecond)
	}
	feed.set(check("n1", "b1", "b", "critical", 10), check("n2", "serfHealth", "", "critical", 11))
	awaitRead("c", cc)
	awaitFeed(api.HealthCritical)

	// b's check passes again (it leaves the answer); b reads, and while
	// it reads the check turns critical again: b reads again before it
	// returns.
	h := make(chan struct{})
	holdB <- h
	b = poll("b")
	feed.set(check("n2", "serfHealth", "", "critical", 11))
	awaitFeed(api.HealthCritical)
	select {
	case <-inRead:
	case <-time.After(10 * time.Second):
		t.Fatalf("b not nudged (stats %+v)", c.Stats())
	}
	feed.set(check("n2", "serfHealth", "", "critical", 11), check("n1", "b1", "b", "critical", 12))
	awaitFeed(api.HealthCritical)
	close(h)
	awaitRead("b", b)
	select {
	case got := <-reads:
		if got != "b" {
			t.Fatalf("read %s, want b again", got)
		}
	default:
		t.Fatal("b returned an answer that may predate the change it was nudged for while it read")
	}

	// A check turning warning: the warning state's query sees it.
	cc = poll("c")
	for c.Stats().Polling != 1 {
		if time.Now().After(deadline) {
			t.Fatal("c is not polling")
		}
		time.Sleep(time.Millisecond)
	}
	feed.set(check("n2", "serfHealth", "", "critical", 11), check("n1", "b1", "b", "critical", 12), check("n3", "c1", "c", "warning", 13))
	awaitRead("c", cc)
	awaitFeed(api.HealthWarning)
	if s := c.Stats(); s.Polls != 5 || s.Nudged != 5 {
		t.Fatalf("stats %+v, want 5 polls, all nudged", s)
	}
	// Every feed query reads one state's checks, which Consul indexes:
	// none reads every check of the datacenter (state/any, a filter).
	feed.mu.Lock()
	defer feed.mu.Unlock()
	for _, q := range feed.asked {
		if q != "/v1/health/state/critical?" && q != "/v1/health/state/warning?" {
			t.Fatalf("feed query %s, want /v1/health/state/critical or warning, no filter", q)
		}
	}
}

// TestFeedSpacesLongAnswers: after an answer of 10,000 checks the feed
// reads again only 200 ms later (feedPerCheck), not after feedGap.
func TestFeedSpacesLongAnswers(t *testing.T) {
	stop := make(chan struct{})
	consul := newFakeChecks()
	var many []*api.HealthCheck
	for i := range 10000 {
		many = append(many, &api.HealthCheck{Node: "n", CheckID: strconv.Itoa(i), ServiceName: "s", Status: "critical", ModifyIndex: 2})
	}
	consul.set(many...)
	reads := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/health/state/") {
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == "/v1/health/state/critical" {
			reads <- struct{}{}
		}
		consul.serve(w, r, stop)
	}))
	defer srv.Close()
	defer close(stop)
	a := apiOf(t, srv)
	clk := clocktesting.NewFakeClock(time.Now())
	c := New(a, Options{MaxWatches: 1, PollEvery: time.Hour, Clock: clk})
	// The critical state's feed alone: its gap timer is then the clock's
	// only one.
	f := &feed{c: c, state: api.HealthCritical}
	go Loop(t.Context(), f.fetch, func(checks []*api.HealthCheck) { f.deliver(t.Context(), checks) }, LoopOptions{Clock: clk})
	select {
	case <-reads: // the first read, at once
	case <-time.After(10 * time.Second):
		t.Fatal("the feed did not read the critical checks")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() { // the gap's timer is the event; the fake clock has no channel for it
		if time.Now().After(deadline) {
			t.Fatalf("the feed did not wait before its second read (%d timers)", clk.Waiters())
		}
		time.Sleep(time.Millisecond)
	}
	clk.Step(feedGap)
	select {
	case <-reads:
		t.Fatal("read again after feedGap, want 200 ms after an answer of 10,000 checks")
	case <-time.After(100 * time.Millisecond): // a read that is not to come has no event; this is the bound of the wait for it
	}
	clk.Step(200*time.Millisecond - feedGap)
	select {
	case <-reads:
	case <-time.After(10 * time.Second):
		t.Fatal("no read 200 ms after the answer")
	}
}
