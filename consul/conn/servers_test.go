package conn

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeAgent answers the reads of an Identity as a Consul agent of
// datacenter dc (knowing dcs, dc's leader is leaders[dc]) with Raft
// servers peers, and every other request with "ok"; it keeps the query
// string of every other request.
type fakeAgent struct {
	*recorder
	dc      string
	dcs     []string
	peers   []string
	trust   string
	leaders map[string]string
	mute    atomic.Bool // answer 503 to everything
	noLead  atomic.Bool // answer 500 "No cluster leader" to everything

	mu      sync.Mutex
	queries []string
}

func newFakeAgent(t *testing.T, dc string, peers ...string) *fakeAgent {
	a := &fakeAgent{recorder: newRecorder(t), dc: dc, dcs: []string{dc}, peers: peers,
		trust: "cluster-" + peers[0] + ".consul", leaders: map[string]string{dc: peers[0]}}
	a.answer = func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case a.mute.Load():
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return true
		case a.noLead.Load():
			http.Error(w, "No cluster leader", http.StatusInternalServerError)
			return true
		}
		var out any
		switch r.URL.Path {
		case "/v1/status/peers":
			out = a.peers
		case "/v1/catalog/datacenters":
			out = a.dcs
		case "/v1/status/leader":
			dc := r.URL.Query().Get("dc")
			if dc == "" {
				dc = a.dc
			}
			out = a.leaders[dc]
		case "/v1/connect/ca/roots":
			out = map[string]string{"TrustDomain": a.trust}
		default:
			a.mu.Lock()
			a.queries = append(a.queries, r.URL.Path+"?"+r.URL.RawQuery)
			a.mu.Unlock()
			return false
		}
		_ = json.NewEncoder(w).Encode(out)
		return true
	}
	return a
}

func (a *fakeAgent) asked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.queries...)
}

// send PUTs an empty body to path (with its query) through rt.
func send(t *testing.T, rt http.RoundTripper, path string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://consul.invalid"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

func newTestServers(t *testing.T, clk *clocktesting.FakeClock, addrs ...string) (*Servers, http.RoundTripper) {
	t.Helper()
	if clk == nil {
		clk = clocktesting.NewFakeClock(time.Now())
	}
	s, err := NewServers(t.Context(), addrs, ServersOptions{Clock: clk, Log: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return s, s.Transport(http.DefaultTransport.(*http.Transport).Clone())
}

// TestIdentifyRefusesMixedAddresses: servers of two datacenters, or of two
// clusters that both call their datacenter dc1, are refused at start with
// what each address is; one cluster's servers (the peers seen while one
// joins overlap) pass.
func TestIdentifyRefusesMixedAddresses(t *testing.T) {
	a := newFakeAgent(t, "dc1", "10.0.0.1:8300", "10.0.0.2:8300")
	for _, tc := range []struct {
		name  string
		other *fakeAgent
		want  []string // in the error; nil: accepted
	}{
		{"another datacenter", newFakeAgent(t, "dc2", "10.1.0.1:8300"), []string{`"dc1"`, `"dc2"`}},
		{"another cluster, same name", newFakeAgent(t, "dc1", "10.9.0.1:8300"), []string{"10.0.0.1:8300,10.0.0.2:8300", "10.9.0.1:8300"}},
		{"same cluster, a server joining", newFakeAgent(t, "dc1", "10.0.0.2:8300", "10.0.0.3:8300"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == nil {
				tc.other.trust = a.trust
			}
			s, _ := newTestServers(t, nil, a.addr(), tc.other.addr())
			_, err := s.Identify(t.Context(), "")
			if tc.want == nil {
				if err != nil {
					t.Fatalf("one cluster refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNotOneCluster) {
				t.Fatalf("err %v, want ErrNotOneCluster", err)
			}
			for _, w := range append(tc.want, a.addr(), tc.other.addr()) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
	t.Run("same servers, another trust domain", func(t *testing.T) {
		b := newFakeAgent(t, "dc1", "10.0.0.1:8300")
		b.trust = "another.consul"
		s, _ := newTestServers(t, nil, a.addr(), b.addr())
		if _, err := s.Identify(t.Context(), ""); !errors.Is(err, ErrNotOneCluster) || !strings.Contains(err.Error(), "another.consul") {
			t.Fatalf("err %v, want the trust domains named", err)
		}
	})
}

// TestIdentifySendsDatacenter: after Identify every request carries the
// addresses' datacenter (of a WAN federation: the one whose leader is the
// agent's), or the configured one; a request naming a dc keeps it.
func TestIdentifySendsDatacenter(t *testing.T) {
	a := newFakeAgent(t, "east", "10.0.0.1:8300")
	a.dcs = []string{"west", "east"}
	a.leaders["west"] = "10.5.0.1:8300"
	for _, tc := range []struct{ flag, want string }{{"", "east"}, {"west", "west"}} {
		s, rt := newTestServers(t, nil, a.addr())
		id, err := s.Identify(t.Context(), tc.flag)
		if err != nil || id.Datacenter != "east" {
			t.Fatalf("identity %v, %v; want datacenter east", id, err)
		}
		before := len(a.asked())
		for _, q := range []string{"/v1/txn", "/v1/kv/x?index=3", "/v1/kv/y?dc=north"} {
			if _, err := send(t, rt, q); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{"/v1/txn?dc=" + tc.want, "/v1/kv/x?index=3&dc=" + tc.want, "/v1/kv/y?dc=north"}
		if got := a.asked()[before:]; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("--consul-datacenter %q: requests %q, want %q", tc.flag, got, want)
		}
	}
}

// TestFailBack: a "No cluster leader" answer moves requests to the next
// address, and they go back to the first once it answers again, after
// failbackMin; when it fails again soon after, the wait doubles.
func TestFailBack(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	first, second := newFakeAgent(t, "dc1", "10.0.0.1:8300"), newFakeAgent(t, "dc1", "10.0.0.1:8300")
	s, rt := newTestServers(t, clk, first.addr(), second.addr())
	if _, err := s.Identify(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	for fail, wait := range []time.Duration{failbackMin, 2 * failbackMin} {
		first.noLead.Store(true)
		if _, err := send(t, rt, "/v1/txn"); err != nil || s.Current() != second.addr() {
			t.Fatalf("failure %d: %v, current %s; want the second address", fail, err, s.Current())
		}
		first.noLead.Store(false)
		clk.Step(wait - time.Millisecond)
		s.failBack(t.Context())
		if s.Current() != second.addr() {
			t.Fatalf("failure %d: back to the first address before %s", fail, wait)
		}
		clk.Step(time.Millisecond)
		s.failBack(t.Context())
		if s.Current() != first.addr() {
			t.Fatalf("failure %d: still on %s %s after the first failed; want the first again", fail, s.Current(), wait)
		}
		n := len(first.asked())
		if _, err := send(t, rt, "/v1/txn"); err != nil || len(first.asked()) != n+1 {
			t.Fatalf("failure %d: the next request did not go to the first address (%v)", fail, err)
		}
		clk.Step(time.Second) // fails again within failbackCalm: the wait doubles
	}
}

// TestPendingAddress: an address that does not answer at start is not
// used (a failover has nowhere to go) until it is checked; once it
// answers as the same cluster it is used; an address of another cluster
// is never used.
func TestPendingAddress(t *testing.T) {
	first, late, alien := newFakeAgent(t, "dc1", "10.0.0.1:8300"), newFakeAgent(t, "dc1", "10.0.0.1:8300"), newFakeAgent(t, "dc1", "10.7.0.1:8300")
	late.mute.Store(true)
	alien.mute.Store(true)
	s, rt := newTestServers(t, nil, first.addr(), late.addr(), alien.addr())
	if _, err := s.Identify(t.Context(), ""); err != nil {
		t.Fatalf("the muted addresses are not checked at start: %v", err)
	}
	first.noLead.Store(true)
	if _, err := send(t, rt, "/v1/txn"); err != nil {
		t.Fatal(err)
	}
	if len(late.asked())+len(alien.asked()) != 0 || s.Current() != first.addr() {
		t.Fatalf("a request went to an address not checked (current %s)", s.Current())
	}
	late.mute.Store(false)
	alien.mute.Store(false)
	s.checkPending(t.Context())
	if why := s.Refused()[alien.addr()]; !strings.Contains(why, "another Consul cluster") || len(s.Refused()) != 1 {
		t.Fatalf("refused %v, want the alien address alone", s.Refused())
	}
	for range 3 {
		if _, err := send(t, rt, "/v1/txn"); err != nil {
			t.Fatal(err)
		}
	}
	if len(late.asked()) != 3 || len(alien.asked()) != 0 {
		t.Fatalf("the checked address got %d requests, the alien one %d; want 3 and 0", len(late.asked()), len(alien.asked()))
	}
}

// TestIdentifyRefusesAnUnknownDatacenter: a --consul-datacenter the
// addresses do not know (a typo) is refused at start, naming it and the
// datacenters they know, instead of every request failing with "No path
// to datacenter" and Start retrying for ever; one they know (a WAN
// federation's other datacenter) is accepted.
func TestIdentifyRefusesAnUnknownDatacenter(t *testing.T) {
	a := newFakeAgent(t, "east", "10.0.0.1:8300")
	a.dcs = []string{"west", "east"}
	a.leaders["west"] = "10.5.0.1:8300"
	s, _ := newTestServers(t, nil, a.addr())
	_, err := s.Identify(t.Context(), "wset")
	if !errors.Is(err, ErrUnknownDatacenter) {
		t.Fatalf("err %v, want ErrUnknownDatacenter", err)
	}
	for _, w := range []string{`"wset"`, "west,east", a.addr()} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %s", err, w)
		}
	}
	if _, err := s.Identify(t.Context(), "west"); err != nil {
		t.Fatalf("a datacenter of the federation refused: %v", err)
	}
}
