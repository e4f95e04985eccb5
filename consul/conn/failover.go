package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/utils/clock"
)

// Servers is the set of Consul HTTP addresses requests go to: one at a time
// (the current one), the next on a connection error, a timeout or a server
// without a leader. Each address is "host:port"; a single host name that
// resolves to several addresses (a headless Service, say) is expanded to
// them, and resolved again when a connection fails.
//
// Servers is an http.RoundTripper wrapper: every request is sent to the
// current address (its URL host rewritten). A request that failed before
// Consul answered (connection refused or reset, "No cluster leader") is
// sent again to the next address, once per address, within the request's
// own context (its --consul-request-timeout deadline): a transaction that
// may have been applied before the connection broke is safe to send again,
// since every op of it is a CAS that fails the second time. A request whose
// deadline passed marks its address bad, so the next request goes to the
// next address.
//
// Once Identify has run, every request without a dc parameter is sent with
// the datacenter's, and only addresses of the one datacenter and cluster
// Identify found are used; Run checks the addresses that did not answer
// then, and goes back to the first address when it answers again.
type Servers struct {
	log      hclog.Logger
	clock    clock.Clock
	lookup   func(ctx context.Context, host string) ([]string, error)
	resolved string // the host name being resolved, "" for a fixed list
	port     string
	scheme   string
	probe    prober        // its transport is set by Transport
	kick     chan struct{} // 1-buffered: wakes Run to check pending addresses

	mu      sync.Mutex
	addrs   []string
	current int
	// lastResolve rate-limits re-resolution to once per resolveEvery.
	lastResolve time.Time
	dc          string    // sent as dc on every request that has none
	want        *Identity // every address's, once Identify has run
	pending     map[string]bool
	refused     map[string]string // address -> why it is not used
	firstFailed time.Time         // when the first address last failed
	backAt      time.Time         // when requests last went back to it
	backWait    time.Duration     // how long after a failure it is tried again
}

// resolveEvery is the least time between two resolutions of the name.
const resolveEvery = time.Second

// ServersOptions configure NewServers; zero values mean the defaults.
type ServersOptions struct {
	Log   hclog.Logger
	Clock clock.Clock
	// Lookup resolves a host name (default net.DefaultResolver.LookupHost).
	Lookup func(ctx context.Context, host string) ([]string, error)
	// Scheme is http (the default) or https: how Identify and Run reach
	// one address.
	Scheme string
}

// NewServers returns the failover set of addrs ("host:port" each, at least
// one). One address whose host is a name (not an IP) is resolved now and
// again after connection failures; a name that does not resolve at start
// is kept as it is (the transport resolves it per connection).
func NewServers(ctx context.Context, addrs []string, opts ServersOptions) (*Servers, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no Consul address")
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Lookup == nil {
		opts.Lookup = net.DefaultResolver.LookupHost
	}
	if opts.Scheme == "" {
		opts.Scheme = "http"
	}
	s := &Servers{log: opts.Log, clock: opts.Clock, lookup: opts.Lookup, scheme: opts.Scheme,
		kick: make(chan struct{}, 1), backWait: failbackMin}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("consul address %q: want host:port: %w", a, err)
		}
	}
	s.addrs = append([]string(nil), addrs...)
	if len(addrs) == 1 {
		host, port, _ := net.SplitHostPort(addrs[0])
		if net.ParseIP(host) == nil && host != "localhost" {
			s.resolved, s.port = host, port
			s.resolve(ctx)
		}
	}
	return s, nil
}

// Addresses returns the addresses, the current one first.
func (s *Servers) Addresses() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.addrs))
	for i := range s.addrs {
		out = append(out, s.addrs[(s.current+i)%len(s.addrs)])
	}
	return out
}

// Current is the address requests go to now.
func (s *Servers) Current() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[s.current]
}

// resolve looks the name up again (at most once per resolveEvery) and, when
// it resolves, replaces the addresses, keeping the current one current if
// it is still among them.
func (s *Servers) resolve(ctx context.Context) {
	if s.resolved == "" {
		return
	}
	s.mu.Lock()
	now := s.clock.Now()
	if !s.lastResolve.IsZero() && now.Sub(s.lastResolve) < resolveEvery {
		s.mu.Unlock()
		return
	}
	s.lastResolve = now
	s.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := s.lookup(lctx, s.resolved)
	if err != nil || len(ips) == 0 {
		s.log.Warn("Cannot resolve the Consul address; keeping the addresses known", "name", s.resolved, "error", err)
		return
	}
	next := make([]string, 0, len(ips))
	for _, ip := range ips {
		next = append(next, net.JoinHostPort(ip, s.port))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.addrs[s.current]
	s.addrs, s.current = next, 0
	for i, a := range next {
		if a == cur {
			s.current = i
		}
	}
	s.log.Debug("Resolved the Consul address", "name", s.resolved, "addresses", strings.Join(next, ","))
}

// failed moves on from addr (if it is still the current one) to the next.
func (s *Servers) failed(ctx context.Context, addr string, why error) {
	s.mu.Lock()
	moved := false
	if s.addrs[s.current] == addr {
		if s.current == 0 && s.resolved == "" {
			s.firstFailedLocked()
		}
		s.current = s.nextLocked()
		moved = true
	}
	next := s.addrs[s.current]
	if len(s.pending) > 0 {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	if moved && next != addr {
		s.log.Warn("Consul server failed; using the next address", "failed", addr, "next", next, "error", why)
	}
	s.resolve(ctx)
}

// nextLocked is the index of the next usable address after the current
// one (the current one when there is no other).
func (s *Servers) nextLocked() int {
	for i := 1; i < len(s.addrs); i++ {
		j := (s.current + i) % len(s.addrs)
		if s.usableLocked(s.addrs[j]) {
			return j
		}
	}
	return s.current
}

// usableLocked: addr is not waiting for its check, nor refused.
func (s *Servers) usableLocked(addr string) bool {
	_, refused := s.refused[addr]
	return !s.pending[addr] && !refused
}

// usable is the number of addresses requests may go to (at least 1).
func (s *Servers) usable() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.addrs {
		if s.usableLocked(a) {
			n++
		}
	}
	return max(n, 1)
}

// Datacenter is the datacenter requests are sent to ("" before Identify,
// unless given).
func (s *Servers) Datacenter() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dc
}

// Transport wraps base: every request goes to the current address, and
// fails over as the type's comment says. Identify and Run read each
// address through base itself.
func (s *Servers) Transport(base http.RoundTripper) http.RoundTripper {
	s.probe = prober{rt: base, scheme: s.scheme}
	return failoverTransport{s: s, base: base}
}

// ResolvedName is the host name being resolved ("" for a fixed list of
// addresses): the name a TLS certificate is checked against.
func (s *Servers) ResolvedName() string { return s.resolved }

type failoverTransport struct {
	s    *Servers
	base http.RoundTripper
}

func (t failoverTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	s := t.s
	ctx := req.Context()
	tries := s.usable()
	dc := s.Datacenter()
	var lastErr error
	for try := 0; try < tries; try++ {
		addr := s.Current()
		r := req.Clone(ctx)
		r.URL.Host, r.Host = addr, addr
		if dc != "" && !r.URL.Query().Has("dc") {
			if r.URL.RawQuery != "" {
				r.URL.RawQuery += "&"
			}
			r.URL.RawQuery += "dc=" + url.QueryEscape(dc)
		}
		if try > 0 {
			if req.Body != nil && req.GetBody == nil {
				return nil, lastErr // cannot send the body again
			}
			if req.GetBody != nil {
				b, err := req.GetBody()
				if err != nil {
					return nil, lastErr
				}
				r.Body = b
			}
		}
		resp, err := t.base.RoundTrip(r)
		if err == nil {
			if noLeader(resp) {
				lastErr = errors.New("consul server " + addr + " has no cluster leader")
				if try+1 < tries {
					resp.Body.Close()
					s.failed(ctx, addr, lastErr)
					continue
				}
			}
			return resp, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// No answer within the request's deadline: the next
				// request tries the next server.
				s.failed(context.Background(), addr, err)
			}
			return nil, err
		}
		if !connectionError(err) {
			return nil, err
		}
		s.failed(ctx, addr, err)
	}
	return nil, lastErr
}

// noLeader reports a 500 "No cluster leader" answer (the body is kept
// readable).
func noLeader(resp *http.Response) bool {
	if resp.StatusCode != http.StatusInternalServerError || resp.Body == nil {
		return false
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return strings.Contains(string(b), "No cluster leader")
}

// connectionError reports an error of the connection itself (refused,
// reset, closed, unreachable, a dial timeout), as opposed to a bad request.
func connectionError(err error) bool {
	var ne net.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &oe), errors.As(err, &ne):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "connection reset") ||
		strings.Contains(msg, "broken pipe") || strings.Contains(msg, "server closed")
}
