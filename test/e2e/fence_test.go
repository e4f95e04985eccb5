package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// delayProxy is an HTTP proxy in front of Consul that, while armed, holds
// each /v1/txn request whose body matches, until release: then it
// forwards it (the request as it was sent, whenever that was) and
// records Consul's status. Everything else passes at once.
type delayProxy struct {
	srv *http.Server
	ln  net.Listener
	rp  *httputil.ReverseProxy

	mu       sync.Mutex
	match    func(body []byte) bool
	held     int // matching requests, held until release and forwarded after
	released chan struct{}
	statuses []int
	changed  chan struct{} // closed and replaced when held or statuses change
}

func newDelayProxy(t *testing.T, target string) *delayProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	to := &url.URL{Scheme: "http", Host: target}
	p := &delayProxy{ln: ln, released: make(chan struct{}), changed: make(chan struct{}),
		rp: &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(to) }, FlushInterval: -1}}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve)}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() {
		p.release()
		_ = p.srv.Close()
	})
	return p
}

func (p *delayProxy) addr() string { return p.ln.Addr().String() }

// arm holds the transactions match accepts from now on (until release;
// those that come after are forwarded at once, and counted).
func (p *delayProxy) arm(match func(body []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match = match
}

// release forwards the held requests and holds no more.
func (p *delayProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.released:
	default:
		close(p.released)
	}
}

func (p *delayProxy) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// wait returns once cond (under the lock) holds.
func (p *delayProxy) wait(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		ok, ch := cond(), p.changed
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (p *delayProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	p.mu.Lock()
	hold := r.URL.Path == "/v1/txn" && p.match != nil && p.match(body)
	if hold {
		p.held++
		p.signal()
	}
	released := p.released
	p.mu.Unlock()
	if !hold {
		p.rp.ServeHTTP(w, r)
		return
	}
	<-released
	// Forwarded even if the client went away meanwhile: what matters is
	// what Consul makes of the request. (After release: at once.)
	fwd := r.Clone(context.WithoutCancel(r.Context()))
	fwd.Body = io.NopCloser(bytes.NewReader(body))
	rec := &statusRecorder{ResponseWriter: w}
	p.rp.ServeHTTP(rec, fwd)
	p.mu.Lock()
	p.statuses = append(p.statuses, rec.status)
	p.signal()
	p.mu.Unlock()
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// TestFrozenReplicaIsFenced: replica a holds every shard (--shards 2) and
// sends a delete of 10.1.0.2 (its endpoint went), which a proxy holds on
// its way to Consul; a is frozen (SIGSTOP) and the endpoint comes back
// with a new one beside it. Replica b starts, takes the shards once their
// Leases expire (taking their fences) and writes the new endpoint. Then a's
// delete reaches Consul: it is refused (a CAS alone would let it through:
// nobody touched that entry since a read it), and after SIGCONT a stops
// the shard's workers and does not send the delete again. The catalog is
// exact and b's write stands.
func TestFrozenReplicaIsFenced(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	c := kube.Client
	ports := map[string]int32{"http": 80}
	ann := map[string]string{optIn: "true", "consul.hashicorp.com/service-name": "fenced"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "web", ann, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 2))))

	// Short leases: the frozen replica's shards move 4 s after it froze.
	lease := []string{"--shards=2", "--lease-namespace=" + e.ns, "--lease-duration=4s", "--lease-renew-deadline=3s", "--lease-retry-period=500ms"}
	proxy := newDelayProxy(t, consul.Addr)
	a, err := fixture.StartDaemon(ctx, fixture.DaemonConfig{
		ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath, ConsulAddr: proxy.addr(), Namespaces: []string{e.ns}, Name: "fleetsync-a",
		// The held transaction is still awaited when a wakes up.
		Args: append(lease, "--replica-id=a", "--consul-request-timeout=2m"),
	})
	if err != nil {
		t.Fatalf("start replica a: %v", err)
	}
	frozen := false
	t.Cleanup(func() {
		if frozen {
			_ = a.Signal(syscall.SIGCONT)
		}
		if t.Failed() {
			t.Logf("replica a log tail:\n%s", a.LogTail(60))
		}
		a.CloseT(t)
	})
	e.waitInstances("fenced", "10.1.0.1:80=passing,10.1.0.2:80=passing")
	before, err := fixture.Instances(consul.Client, "fenced", e.node())
	must(t, err)

	// a's delete of 10.1.0.2 is held on its way to Consul; a freezes.
	proxy.arm(func(body []byte) bool { return bytes.Contains(body, []byte(`"delete-cas"`)) })
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 1))))
	proxy.wait(t, "a's delete held", 15*time.Second, func() bool { return proxy.held == 1 })
	must(t, a.Signal(syscall.SIGSTOP))
	frozen = true
	frozenAt := time.Now()

	// The endpoint comes back, with another; b takes the shards and writes.
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 3))))
	b := e.daemonFor(e.cluster, []string{e.ns}, append(lease, "--replica-id=b")...)
	eventually(t, 30*time.Second, "b holds both shards", func() error {
		var sh struct{ Held []int }
		_, body, err := b.Get(ctx, "/debug/shards", "")
		if err == nil {
			err = json.Unmarshal([]byte(body), &sh)
		}
		if err != nil || !slices.Equal(sh.Held, []int{0, 1}) {
			return fmt.Errorf("b holds %v (%v)", sh.Held, err)
		}
		return nil
	})
	want := "10.1.0.1:80=passing,10.1.0.2:80=passing,10.1.0.3:80=passing"
	e.waitInstances("fenced", want)
	t.Logf("b took the shards and wrote 10.1.0.3 %s after a froze", time.Since(frozenAt).Round(100*time.Millisecond))
	written, err := fixture.Instances(consul.Client, "fenced", e.node())
	must(t, err)

	// a's delete reaches Consul now: refused on the fence.
	proxy.release()
	proxy.wait(t, "a's held delete answered", 15*time.Second, func() bool { return len(proxy.statuses) == 1 })
	proxy.mu.Lock()
	st := proxy.statuses[0]
	proxy.mu.Unlock()
	if st != http.StatusConflict {
		t.Errorf("a's stale delete: Consul answered %d, want %d (rolled back)", st, http.StatusConflict)
	}
	must(t, a.Signal(syscall.SIGCONT))
	frozen = false
	// a wakes up and stops the shard's workers, told either by the
	// refusal (the answer waits for it: the fence, counted) or by its
	// Lease (its election gives up when a Lease request was in flight as
	// it froze, and cancels the write before it reads the answer); which
	// of its goroutines runs first on waking decides. The catalog is
	// checked either way.
	how := ""
	for end := time.Now().Add(20 * time.Second); how == "" && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		switch {
		case metricValue(scrape(t, a), "fleetsync_shard_fenced_total") == 1 && logged(a, "Shard fenced"):
			how = "the refused write (fleetsync_shard_fenced_total 1)"
		case logged(a, "Shard lost"):
			how = "its Lease"
		}
	}
	if how == "" {
		t.Errorf("a did not stop the shard's workers after it woke (no Shard fenced, no Shard lost)")
	} else {
		t.Logf("a woke up and stopped the shard's workers, told by %s", how)
	}

	// Exact, with b's write and the entries a had written untouched.
	after, err := fixture.Instances(consul.Client, "fenced", e.node())
	must(t, err)
	if got := fixture.Keys(after, true); got != want {
		t.Errorf("catalog after a woke: %s, want %s", got, want)
	}
	index := func(ins []fixture.Instance) map[string]uint64 {
		out := map[string]uint64{}
		for _, in := range ins {
			out[in.Key()] = in.ModifyIndex
		}
		return out
	}
	was, had, now := index(before), index(written), index(after)
	if now["10.1.0.2:80"] != was["10.1.0.2:80"] {
		t.Errorf("10.1.0.2 gone or rewritten: index %d (0: gone), was %d", now["10.1.0.2:80"], was["10.1.0.2:80"])
	}
	if now["10.1.0.3:80"] != had["10.1.0.3:80"] {
		t.Errorf("b's 10.1.0.3 changed after a woke: index %d, b wrote %d", now["10.1.0.3:80"], had["10.1.0.3:80"])
	}
	proxy.mu.Lock()
	deletes := proxy.held
	proxy.mu.Unlock()
	if deletes != 1 {
		t.Errorf("%d deletes of a reached the proxy, want 1 (the stale one, never retried)", deletes)
	}
}

// logged reports whether d's logs hold s.
func logged(d *fixture.Daemon, s string) bool {
	for _, path := range d.Logs() {
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}
