package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// ConsulOptions tune StartConsul. The zero value is fine.
type ConsulOptions struct {
	// BinDir holds consul; default BinDir().
	BinDir string
	// StartTimeout bounds one start (and each restart), retries included;
	// default DefaultStartTimeout (the context's deadline also applies).
	StartTimeout time.Duration
	// NodeName is the agent's node name; default a unique
	// "fleetsync-test-<random>". With Servers > 1, server i is
	// "<NodeName>-<i>".
	NodeName string
	// ExtraArgs are appended to `consul agent`'s flags (of every server).
	ExtraArgs []string
	// Token is the ACL token the harness itself uses (its readiness checks,
	// Client, metrics, snapshots), for agents started with ACLs on and a
	// deny default.
	Token string
	// ACL starts every agent with ACLs on and a deny default, Token (a
	// random UUID when empty) as the initial management token and as the
	// agents' own token. Consul.Token holds it.
	ACL bool
	// Servers picks the kind of Consul. 0 (the default) is one `consul
	// agent -dev`: in-memory, a restart loses everything. N >= 1 is N real
	// server agents (`-server -bootstrap-expect=N`), each with a data dir of
	// its own that survives restarts, kill -9 included.
	Servers int
	// TLS, when set, has every agent serve its HTTP API over HTTPS too, on
	// a port of its own (HTTPSAddr), with these files; clients are not
	// verified. Plain HTTP stays on.
	TLS *TLSFiles
}

// Consul is a running Consul on 127.0.0.1: either one `consul agent -dev`
// (server, in-memory state) or a cluster of server agents with data dirs
// (ConsulOptions.Servers). Every agent has its HTTP API, server RPC and serf
// LAN/WAN on free ports, DNS and gRPC off, Prometheus metrics retained (for
// RaftApplies). The top-level fields are those of agent 0 (the dev agent, or
// server 0); Server(i) has each agent's own.
//
// The lifecycle methods (Restart, RestartServer, KillServer, ...) are
// serialised with each other; the getters may be called at any time.
type Consul struct {
	// Client talks to agent 0's HTTP API (it survives restarts; while
	// server 0 is down it fails, the other servers' Clients do not).
	Client *consulapi.Client
	// Addr is agent 0's "127.0.0.1:<http port>"; HTTPAddr is "http://" + Addr.
	Addr, HTTPAddr string
	// HTTPSAddr is agent 0's "127.0.0.1:<https port>" with ConsulOptions.TLS,
	// else "".
	HTTPSAddr string
	// Version is the agent's version from /v1/agent/self, e.g. "1.14.11".
	Version string
	// NodeName is agent 0's own node in the catalog.
	NodeName string
	// Token is the harness's ACL token (ConsulOptions.Token; with ACL
	// the management token).
	Token string
	// Dir is the temp dir with the agents' logs (consul.log, then
	// consul-restart-N.log; for servers consul-<i>.log and
	// consul-<i>-restart-N.log) and the servers' data dirs; Stop removes it.
	Dir string

	opts      ConsulOptions
	bin       string
	transport *http.Transport
	http      *http.Client
	servers   []*ConsulServer // fixed at start

	opMu sync.Mutex // serialises starts, stops and kills

	stopOnce sync.Once
	stopErr  error
}

// ConsulServer is one agent of a Consul: the dev agent, or one server. Its
// exported fields are set before StartConsul returns and never change.
type ConsulServer struct {
	// Index is its place in Consul.Servers.
	Index int
	// NodeName is its node in the catalog.
	NodeName string
	// Addr is "127.0.0.1:<http port>"; HTTPAddr is "http://" + Addr.
	Addr, HTTPAddr string
	// HTTPSAddr is "127.0.0.1:<https port>" with ConsulOptions.TLS, else "".
	HTTPSAddr string
	// Client talks to this agent's HTTP API; it survives restarts.
	Client *consulapi.Client
	// DataDir is the server's -data-dir (under Consul.Dir); "" for the dev
	// agent, whose state is in memory.
	DataDir string

	mu     sync.Mutex
	proc   *Process
	ports  consulPorts // all fixed after the first start, except a dev agent's non-HTTP ports
	starts int
}

// consulPorts are the ports one agent listens on.
type consulPorts struct{ http, https, server, serfLAN, serfWAN int }

// Agent is the server's current process (a new one after each restart).
func (s *ConsulServer) Agent() *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Running reports whether the server's current process runs.
func (s *ConsulServer) Running() bool {
	p := s.Agent()
	return p != nil && !p.Exited()
}

// raftAddr is what /v1/status/leader and the Raft configuration call it.
func (s *ConsulServer) raftAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "127.0.0.1:" + strconv.Itoa(s.ports.server)
}

// consulTelemetry keeps Prometheus metrics (the running consul_raft_apply
// total) and leaves the host name out of metric names.
const consulTelemetry = `telemetry { prometheus_retention_time = "24h" disable_hostname = true }`

// ConsulT starts a dev Consul for t; see ConsulOptionsT.
func ConsulT(t testing.TB) *Consul {
	t.Helper()
	return ConsulOptionsT(t, ConsulOptions{})
}

// ConsulOptionsT starts a Consul with opts for t and stops it in t.Cleanup;
// when t has failed by then, each agent's log tail goes to t.Log. It skips t
// under -short and fails t when the start fails.
func ConsulOptionsT(t testing.TB, opts ConsulOptions) *Consul {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real Consul agent; skipped under -short")
	}
	start := time.Now()
	c, err := StartConsul(context.Background(), opts)
	if err != nil {
		t.Fatalf("starting consul: %v", err)
	}
	t.Logf("consul %s at %s (%s) ready in %s", c.Version, c.HTTPAddr, c.kind(), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range c.servers {
				if p := s.Agent(); p != nil {
					t.Logf("consul %s log tail:\n%s", s.NodeName, indent(p.LogTail(40)))
				}
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping consul: %v", err)
		}
	})
	return c
}

// StartConsul starts a Consul and returns once every agent sees a leader
// and a consistent read of its own node in the catalog succeeds (so the
// leader has established itself and catalog writes go through). A single
// server is ready in about 2 s (the dev agent in 0.3 s): it elects itself
// first. The caller must call Stop.
func StartConsul(ctx context.Context, opts ConsulOptions) (*Consul, error) {
	if opts.Servers < 0 {
		return nil, fmt.Errorf("consul: Servers = %d; want 0 (dev agent) or more", opts.Servers)
	}
	bin, err := binPath(opts.BinDir, ConsulBin)
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir("consul")
	if err != nil {
		return nil, err
	}
	if opts.ACL && opts.Token == "" {
		opts.Token = randomUUID()
	}
	c := &Consul{Dir: dir, opts: opts, bin: bin, Token: opts.Token}
	c.transport = &http.Transport{
		Proxy:               nil, // loopback only; ignore HTTP(S)_PROXY
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	c.http = &http.Client{Transport: c.transport}
	if err := c.init(); err != nil {
		_ = c.Stop()
		return nil, err
	}
	if err := c.start(ctx, c.servers, true); err != nil {
		_ = c.Stop()
		return nil, err
	}
	s0 := c.servers[0]
	c.Client, c.Addr, c.HTTPAddr, c.HTTPSAddr, c.NodeName = s0.Client, s0.Addr, s0.HTTPAddr, s0.HTTPSAddr, s0.NodeName
	if c.Version, err = agentVersion(s0.Client); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// init makes the servers: node names, data dirs; ports come with the first
// start.
func (c *Consul) init() error {
	base := c.opts.NodeName
	if base == "" {
		base = "fleetsync-test-" + randomToken()[:8]
	}
	n := max(c.opts.Servers, 1)
	for i := range n {
		s := &ConsulServer{Index: i, NodeName: base}
		if n > 1 {
			s.NodeName = base + "-" + strconv.Itoa(i)
		}
		if !c.dev() {
			s.DataDir = filepath.Join(c.Dir, "data-"+strconv.Itoa(i))
			if err := os.MkdirAll(s.DataDir, 0o755); err != nil {
				return err
			}
		}
		c.servers = append(c.servers, s)
	}
	return nil
}

func (c *Consul) dev() bool { return c.opts.Servers == 0 }

func (c *Consul) kind() string {
	if c.dev() {
		return "dev agent"
	}
	return fmt.Sprintf("%d server(s)", len(c.servers))
}

func agentVersion(cl *consulapi.Client) (string, error) {
	self, err := cl.Agent().Self()
	if err != nil {
		return "", fmt.Errorf("/v1/agent/self: %w", err)
	}
	v, _ := self["Config"]["Version"].(string)
	if v == "" {
		return "", fmt.Errorf("/v1/agent/self: no Config.Version")
	}
	return v, nil
}

// Servers returns every agent: the dev agent alone, or servers 0..N-1.
func (c *Consul) Servers() []*ConsulServer { return append([]*ConsulServer(nil), c.servers...) }

// Server returns agent i (0 is the dev agent or server 0). It panics when i
// is out of range, like an index.
func (c *Consul) Server(i int) *ConsulServer { return c.servers[i] }

// ServerClient is Server(i).Client: a client of server i alone.
func (c *Consul) ServerClient(i int) *consulapi.Client { return c.servers[i].Client }

// Agent is agent 0's current process (a new one after each restart).
func (c *Consul) Agent() *Process { return c.servers[0].Agent() }

// Restart kills every agent (SIGKILL, like a crash) and starts them again on
// the same HTTP addresses, so Client and Addr stay valid. The dev agent comes
// back empty ("Consul lost its data"; its other ports may change); servers
// come back with their data dirs and all their ports. It returns once every
// agent sees a leader and reads its own node consistently.
func (c *Consul) Restart(ctx context.Context) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if err := c.each(c.servers, (*Process).Kill); err != nil {
		return err
	}
	return c.start(ctx, c.servers, false)
}

// RestartEmpty stops every agent (SIGTERM), wipes the servers' data dirs and
// starts them again on the same ports: Consul lost its data. The servers form
// a new cluster (new node IDs, a new Raft log starting at index 1). For the
// dev agent it is Restart with a graceful stop.
func (c *Consul) RestartEmpty(ctx context.Context) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if err := c.each(c.servers, (*Process).Stop); err != nil {
		return err
	}
	if err := c.wipe(c.servers); err != nil {
		return err
	}
	return c.start(ctx, c.servers, false)
}

// RestartServer stops server i gracefully (SIGTERM: a server shuts down
// without leaving the cluster) and starts it again with the same data dir
// and ports; it returns once the server sees a leader and reads its own
// node consistently. The dev agent (i = 0) comes back empty.
func (c *Consul) RestartServer(ctx context.Context, i int) error {
	s, err := c.server(i)
	if err != nil {
		return err
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if err := c.each([]*ConsulServer{s}, (*Process).Stop); err != nil {
		return err
	}
	return c.start(ctx, []*ConsulServer{s}, false)
}

// KillServer SIGKILLs server i (a crash: no graceful shutdown, no leave) and
// waits for the exit. Its data dir stays; StartServer brings it back.
func (c *Consul) KillServer(i int) error {
	s, err := c.server(i)
	if err != nil {
		return err
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	return c.each([]*ConsulServer{s}, (*Process).Kill)
}

// StopServer stops server i gracefully (SIGTERM, a grace period, SIGKILL)
// and waits for the exit. Its data dir stays; StartServer brings it back.
func (c *Consul) StopServer(i int) error {
	s, err := c.server(i)
	if err != nil {
		return err
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	return c.each([]*ConsulServer{s}, (*Process).Stop)
}

// StartServer starts server i, which must not be running, with its data
// dir and ports, and waits until it sees a leader and reads its own node
// consistently. That needs a quorum: with more than half of the servers
// down, start them together with Restart instead.
func (c *Consul) StartServer(ctx context.Context, i int) error {
	s, err := c.server(i)
	if err != nil {
		return err
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if s.Running() {
		return fmt.Errorf("consul server %d (%s) is already running", i, s.NodeName)
	}
	return c.start(ctx, []*ConsulServer{s}, false)
}

func (c *Consul) server(i int) (*ConsulServer, error) {
	if i < 0 || i >= len(c.servers) {
		return nil, fmt.Errorf("consul server %d: there are %d", i, len(c.servers))
	}
	return c.servers[i], nil
}

// each ends the current processes of ss together with end (Stop or Kill),
// then drops the idle connections to them.
func (c *Consul) each(ss []*ConsulServer, end func(*Process) error) error {
	errs := make([]error, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss {
		if p := s.Agent(); p != nil {
			wg.Go(func() { errs[i] = end(p) })
		}
	}
	wg.Wait()
	c.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// wipe empties the data dirs of ss (stopped).
func (c *Consul) wipe(ss []*ConsulServer) error {
	for _, s := range ss {
		if s.DataDir == "" {
			continue
		}
		if err := os.RemoveAll(s.DataDir); err != nil {
			return err
		}
		if err := os.MkdirAll(s.DataDir, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Kill SIGKILLs every agent and waits for the exits; the Consul is down
// until Restart (or StartServer of each). Stop still cleans up afterwards.
func (c *Consul) Kill() error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	return c.each(c.servers, (*Process).Kill)
}

// Stop stops every agent (SIGTERM, a grace period, SIGKILL) and removes Dir,
// data dirs included. It is idempotent.
func (c *Consul) Stop() error {
	c.stopOnce.Do(func() {
		c.opMu.Lock()
		defer c.opMu.Unlock()
		err := c.each(c.servers, (*Process).Stop)
		for _, s := range c.servers {
			if p := s.Agent(); p != nil {
				p.cacheTail()
			}
		}
		c.stopErr = errors.Join(err, os.RemoveAll(c.Dir))
	})
	return c.stopErr
}
