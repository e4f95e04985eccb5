package conn

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	clocktesting "k8s.io/utils/clock/testing"
)

// recorder is an HTTP server that answers every request with 200 "ok"
// (or what answer says) and keeps the bodies it got.
type recorder struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []string
	answer func(w http.ResponseWriter, r *http.Request) bool // true: answered
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.bodies = append(rec.bodies, string(b))
		answer := rec.answer
		rec.mu.Unlock()
		if answer != nil && answer(w, r) {
			return
		}
		_, _ = io.WriteString(w, `"ok"`)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (r *recorder) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

// deadAddr is a loopback address nothing listens on (connection refused).
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func put(t *testing.T, rt http.RoundTripper, ctx context.Context, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://consul.invalid/v1/txn", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		t.Cleanup(func() { resp.Body.Close() })
	}
	return resp, err
}

// TestFailoverOnConnectionError: the first address refuses connections; a
// PUT (a transaction) goes to the second with its whole body, and later
// requests stay there.
func TestFailoverOnConnectionError(t *testing.T) {
	good := newRecorder(t)
	s, err := NewServers(t.Context(), []string{deadAddr(t), good.addr()}, ServersOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rt := s.Transport(http.DefaultTransport.(*http.Transport).Clone())
	for i, body := range []string{`[{"KV":{"Verb":"check-index"}}]`, `second`} {
		resp, err := put(t, rt, t.Context(), body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %v %v", i, resp, err)
		}
	}
	if got := good.got(); len(got) != 2 || got[0] != `[{"KV":{"Verb":"check-index"}}]` || got[1] != "second" {
		t.Fatalf("the live server got %q, want both bodies whole, once each", got)
	}
	if s.Current() != good.addr() {
		t.Fatalf("current %s, want the live %s", s.Current(), good.addr())
	}
}

// TestFailoverNoLeader: a server that answers 500 "No cluster leader" is
// left for the next; a server error of another kind is returned as it is.
func TestFailoverNoLeader(t *testing.T) {
	lost, good := newRecorder(t), newRecorder(t)
	lost.answer = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "No cluster leader", http.StatusInternalServerError)
		return true
	}
	s, _ := NewServers(t.Context(), []string{lost.addr(), good.addr()}, ServersOptions{})
	rt := s.Transport(http.DefaultTransport.(*http.Transport).Clone())
	resp, err := put(t, rt, t.Context(), "txn")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("got %v %v, want the second server's 200", resp, err)
	}
	if len(lost.got()) != 1 || len(good.got()) != 1 {
		t.Fatalf("leaderless server got %d, live one %d requests; want 1 and 1", len(lost.got()), len(good.got()))
	}
	good.answer = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "rpc error: something else", http.StatusInternalServerError)
		return true
	}
	resp, err = put(t, rt, t.Context(), "txn")
	if err != nil || resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("got %v %v, want the 500 of the server asked", resp, err)
	}
	if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), "something else") {
		t.Fatalf("body %q lost", b)
	}
	if len(lost.got()) != 1 {
		t.Fatal("a plain server error failed over")
	}
}

// TestFailoverAfterTimeout: a server that never answers costs the request
// its deadline (no second try inside it), and the next request goes to the
// next server.
func TestFailoverAfterTimeout(t *testing.T) {
	release := make(chan struct{})
	hung, good := newRecorder(t), newRecorder(t)
	hung.answer = func(w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return true
	}
	defer close(release)
	s, _ := NewServers(t.Context(), []string{hung.addr(), good.addr()}, ServersOptions{})
	rt := s.Transport(http.DefaultTransport.(*http.Transport).Clone())
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := put(t, rt, ctx, "txn"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the request's deadline", err)
	}
	if len(good.got()) != 0 {
		t.Fatal("the request was sent twice within its deadline")
	}
	next, cancelNext := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancelNext()
	resp, err := put(t, rt, next, "next")
	if err != nil || resp.StatusCode != http.StatusOK || len(good.got()) != 1 {
		t.Fatalf("next request: %v %v (live server got %d)", resp, err, len(good.got()))
	}
	// A cancelled request (shutdown) is no verdict on the server.
	ctx2, cancel2 := context.WithCancel(t.Context())
	cancel2()
	_, _ = put(t, rt, ctx2, "cancelled")
	if s.Current() != good.addr() {
		t.Fatalf("a cancelled request moved off %s to %s", good.addr(), s.Current())
	}
}

// TestFailoverResolvesAgain: one host name is expanded to its addresses;
// when they fail, the name is resolved again (at most once a second on the
// clock) and the new address is used.
func TestFailoverResolvesAgain(t *testing.T) {
	good := newRecorder(t)
	_, port, _ := net.SplitHostPort(good.addr())
	clk := clocktesting.NewFakeClock(time.Now())
	var lookups atomic.Int32
	var answer atomic.Value
	answer.Store([]string{"127.0.0.2"}) // nothing listens on 127.0.0.2:<port>
	lookup := func(ctx context.Context, host string) ([]string, error) {
		if host != "consul.example" {
			t.Errorf("looked up %q", host)
		}
		lookups.Add(1)
		return answer.Load().([]string), nil
	}
	s, err := NewServers(t.Context(), []string{"consul.example:" + port}, ServersOptions{Clock: clk, Lookup: lookup})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Addresses(); len(got) != 1 || got[0] != "127.0.0.2:"+port || lookups.Load() != 1 {
		t.Fatalf("addresses %v after %d lookups, want the name's", got, lookups.Load())
	}
	rt := s.Transport(http.DefaultTransport.(*http.Transport).Clone())
	// The name now resolves to the live server, but a second lookup within
	// a second of the first is not made: the request fails.
	answer.Store([]string{"127.0.0.1"})
	if _, err := put(t, rt, t.Context(), "a"); err == nil {
		t.Fatal("request to a dead address succeeded")
	}
	if lookups.Load() != 1 {
		t.Fatalf("%d lookups within a second", lookups.Load())
	}
	clk.Step(2 * time.Second)
	if _, err := put(t, rt, t.Context(), "b"); err == nil {
		t.Fatal("dead address again: want an error for this request")
	}
	if lookups.Load() != 2 || s.Current() != "127.0.0.1:"+port {
		t.Fatalf("after %d lookups current is %s, want the new address", lookups.Load(), s.Current())
	}
	resp, err := put(t, rt, t.Context(), "c")
	if err != nil || resp.StatusCode != http.StatusOK || len(good.got()) != 1 || good.got()[0] != "c" {
		t.Fatalf("after re-resolving: %v %v, server got %q", resp, err, good.got())
	}
}

// TestFailoverThroughAPIClient: a consul/api client built with two
// addresses reads through the second when the first is gone, with the
// query string intact.
func TestFailoverThroughAPIClient(t *testing.T) {
	good := newRecorder(t)
	var query atomic.Value
	good.answer = func(w http.ResponseWriter, r *http.Request) bool {
		query.Store(r.URL.RawQuery)
		_, _ = io.WriteString(w, `"127.0.0.1:8300"`)
		return true
	}
	s, _ := NewServers(t.Context(), []string{deadAddr(t), good.addr()}, ServersOptions{})
	ts, _ := NewTokenSource("", "", nil)
	cfg := api.DefaultNonPooledConfig()
	cfg.Datacenter = "dc2"
	c, err := NewAPIClient(cfg, ts, s)
	if err != nil {
		t.Fatal(err)
	}
	leader, err := c.Status().Leader()
	if err != nil || leader != "127.0.0.1:8300" {
		t.Fatalf("leader %q, %v", leader, err)
	}
	if q, _ := query.Load().(string); q != "dc=dc2" {
		t.Fatalf("query %q, want dc=dc2", q)
	}
}
