package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// ConsulOptions tune StartConsul. The zero value is fine.
type ConsulOptions struct {
	// BinDir holds consul; default BinDir().
	BinDir string
	// StartTimeout bounds one start (and each Restart), retries included;
	// default DefaultStartTimeout (the context's deadline also applies).
	StartTimeout time.Duration
	// NodeName is the agent's node name; default a unique
	// "fleetsync-test-<random>".
	NodeName string
	// ExtraArgs are appended to `consul agent`'s flags.
	ExtraArgs []string
	// Token is the ACL token the harness itself uses (its readiness checks,
	// Client, metrics), for agents started with ACLs on and a deny default.
	Token string
}

// Consul is a running `consul agent -dev` (server, in-memory state) on
// 127.0.0.1: HTTP API on a free port, server RPC and serf LAN/WAN on free
// ports, DNS and gRPC off, Prometheus metrics retained (for RaftApplies).
type Consul struct {
	// Client talks to the agent's HTTP API (it survives Restart).
	Client *consulapi.Client
	// Addr is "127.0.0.1:<http port>"; HTTPAddr is "http://" + Addr.
	Addr, HTTPAddr string
	// Version is the agent's version from /v1/agent/self, e.g. "1.14.11".
	Version string
	// NodeName is the agent's own node in the catalog.
	NodeName string
	// Dir is the temp dir with the agent's logs (consul.log, then
	// consul-restart-N.log); Stop removes it.
	Dir string

	opts      ConsulOptions
	bin       string
	httpPort  int
	transport *http.Transport
	http      *http.Client

	mu       sync.Mutex
	agent    *Process
	restarts int

	stopOnce sync.Once
	stopErr  error
}

// consulTelemetry keeps Prometheus metrics (the running consul_raft_apply
// total) and leaves the host name out of metric names.
const consulTelemetry = `telemetry { prometheus_retention_time = "24h" disable_hostname = true }`

// ConsulT starts a Consul for t and stops it in t.Cleanup; when t has failed
// by then, the agent's log tail goes to t.Log. It skips t under -short and
// fails t when the start fails.
func ConsulT(t testing.TB) *Consul {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real Consul agent; skipped under -short")
	}
	start := time.Now()
	c, err := StartConsul(context.Background(), ConsulOptions{})
	if err != nil {
		t.Fatalf("starting consul: %v", err)
	}
	t.Logf("consul %s at %s ready in %s", c.Version, c.HTTPAddr, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consul log tail:\n%s", indent(c.Agent().LogTail(40)))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping consul: %v", err)
		}
	})
	return c
}

// StartConsul starts a Consul dev agent and returns once it has a leader and
// its own node is in the catalog. The caller must call Stop.
func StartConsul(ctx context.Context, opts ConsulOptions) (*Consul, error) {
	bin, err := binPath(opts.BinDir, ConsulBin)
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir("consul")
	if err != nil {
		return nil, err
	}
	c := &Consul{Dir: dir, opts: opts, bin: bin, NodeName: opts.NodeName}
	if c.NodeName == "" {
		c.NodeName = "fleetsync-test-" + randomToken()[:8]
	}
	c.transport = &http.Transport{
		Proxy:               nil, // loopback only; ignore HTTP(S)_PROXY
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	c.http = &http.Client{Transport: c.transport}
	if err := c.start(ctx, "consul"); err != nil {
		_ = c.Stop()
		return nil, err
	}
	if c.Client, err = consulapi.NewClient(&consulapi.Config{Address: c.Addr, Scheme: "http", HttpClient: c.http, Token: c.opts.Token}); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// start runs a fresh agent (retrying on port clashes). The first start picks
// the HTTP port; later ones (Restart) keep it.
func (c *Consul) start(ctx context.Context, name string) error {
	ctx, cancel := withStartTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		p, err := c.startOnce(ctx, name)
		if err == nil {
			c.mu.Lock()
			c.agent = p
			c.mu.Unlock()
			return nil
		}
		// A first start may retry with a new HTTP port too; a restart
		// keeps its HTTP port, so only the others can change.
		if !errors.Is(err, errPortTaken) || attempt == startAttempts || ctx.Err() != nil {
			return fmt.Errorf("consul (attempt %d): %w", attempt, err)
		}
	}
}

func (c *Consul) startOnce(ctx context.Context, name string) (_ *Process, err error) {
	first := c.httpPort == 0
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	httpPort := c.httpPort
	if first {
		httpPort = ports[3]
	}
	addr := "127.0.0.1:" + strconv.Itoa(httpPort)
	args := []string{
		"agent", "-dev",
		"-node=" + c.NodeName,
		"-bind=127.0.0.1",
		"-client=127.0.0.1",
		"-http-port=" + strconv.Itoa(httpPort),
		"-server-port=" + strconv.Itoa(ports[0]),
		"-serf-lan-port=" + strconv.Itoa(ports[1]),
		"-serf-wan-port=" + strconv.Itoa(ports[2]),
		"-dns-port=-1",
		"-grpc-port=-1",
		"-grpc-tls-port=-1",
		"-hcl=" + consulTelemetry,
		"-log-level=info",
	}
	p, err := StartProcess(ctx, name, c.bin, append(args, c.opts.ExtraArgs...), nil, c.Dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = p.Kill()
		}
	}()
	base := "http://" + addr
	// Leader first, then our own node in the catalog: by then the agent
	// accepts catalog writes and its anti-entropy has run once.
	if err := waitFor(ctx, "consul leader", []*Process{p}, func(ctx context.Context) (bool, error) {
		code, body, err := httpGet(ctx, c.http, base+"/v1/status/leader", c.opts.Token)
		if err != nil {
			return false, err
		}
		leader := strings.Trim(strings.TrimSpace(body), `"`)
		return code == http.StatusOK && leader != "", fmt.Errorf("/v1/status/leader: %d %q", code, body)
	}); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, "consul node registration", []*Process{p}, func(ctx context.Context) (bool, error) {
		code, body, err := httpGet(ctx, c.http, base+"/v1/catalog/node/"+c.NodeName, c.opts.Token)
		if err != nil {
			return false, err
		}
		return code == http.StatusOK && strings.Contains(body, `"Node"`) && body != "null", fmt.Errorf("/v1/catalog/node: %d %.200s", code, body)
	}); err != nil {
		return nil, err
	}
	if first {
		// Set once: Restart keeps the address (and the binary), so these
		// fields never change under a concurrent reader.
		version, err := c.agentVersion(ctx, base)
		if err != nil {
			return nil, fmt.Errorf("%w\n  %s", err, p.describe())
		}
		c.httpPort, c.Addr, c.HTTPAddr, c.Version = httpPort, addr, base, version
	}
	return p, nil
}

func (c *Consul) agentVersion(ctx context.Context, base string) (string, error) {
	// The typed client is not built yet on the first start.
	cl, err := consulapi.NewClient(&consulapi.Config{Address: strings.TrimPrefix(base, "http://"), Scheme: "http", HttpClient: c.http, Token: c.opts.Token})
	if err != nil {
		return "", err
	}
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

// Agent is the currently running agent process (a new one after Restart).
func (c *Consul) Agent() *Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.agent
}

// Restart kills the agent (SIGKILL, like a crash) and starts a fresh one with
// empty state on the same HTTP address, so Client and Addr stay valid: this
// is "Consul lost its data". It returns once the new agent has a leader and
// its node is registered.
func (c *Consul) Restart(ctx context.Context) error {
	if err := c.Kill(); err != nil {
		return err
	}
	c.transport.CloseIdleConnections()
	c.mu.Lock()
	c.restarts++
	name := "consul-restart-" + strconv.Itoa(c.restarts)
	c.mu.Unlock()
	return c.start(ctx, name)
}

// Kill SIGKILLs the agent and waits for it to exit; the Consul is down until
// Restart. Stop still cleans up afterwards.
func (c *Consul) Kill() error {
	if p := c.Agent(); p != nil {
		return p.Kill()
	}
	return nil
}

// Stop stops the agent (SIGTERM, a grace period, SIGKILL) and removes Dir.
// It is idempotent.
func (c *Consul) Stop() error {
	c.stopOnce.Do(func() {
		var errs []error
		if p := c.Agent(); p != nil {
			errs = append(errs, p.Stop())
			p.cacheTail()
		}
		c.transport.CloseIdleConnections()
		errs = append(errs, os.RemoveAll(c.Dir))
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}

// RaftApplyMetric is the Prometheus counter of Raft applies on the server.
const RaftApplyMetric = "consul_raft_apply"

// RaftApplies returns the agent's running total of Raft applies (each one a
// replicated write; a catalog register, deregister or /v1/txn costs one),
// read from /v1/agent/metrics?format=prometheus. It starts again from zero
// after Restart. A counter not yet emitted reads as 0.
func (c *Consul) RaftApplies() (float64, error) {
	return c.counter(context.Background(), RaftApplyMetric)
}

func (c *Consul) counter(ctx context.Context, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.HTTPAddr+"/v1/agent/metrics?format=prometheus", nil)
	if err != nil {
		return 0, err
	}
	if c.opts.Token != "" {
		req.Header.Set("X-Consul-Token", c.opts.Token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("consul metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("consul metrics: HTTP %d", resp.StatusCode)
	}
	v, _, err := parsePromCounter(bufio.NewScanner(resp.Body), name)
	return v, err
}

// parsePromCounter sums the samples of metric name (all label sets) in the
// Prometheus text format. found is false when no sample was there.
func parsePromCounter(sc *bufio.Scanner, name string) (v float64, found bool, err error) {
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		switch {
		case strings.HasPrefix(rest, " "):
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				return 0, false, fmt.Errorf("malformed sample %q", line)
			}
			rest = rest[end+1:]
		default:
			continue // another metric with this prefix, e.g. consul_raft_apply_foo
		}
		fields := strings.Fields(rest) // value [timestamp]
		if len(fields) == 0 {
			return 0, false, fmt.Errorf("malformed sample %q", line)
		}
		f, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("sample %q: %w", line, err)
		}
		v += f
		found = true
	}
	return v, found, sc.Err()
}

// Counter returns the sum of every sample of metric name (all label sets)
// from /v1/agent/metrics?format=prometheus.
func (c *Consul) Counter(name string) (float64, error) {
	return c.counter(context.Background(), name)
}

// CatalogTxns returns consul_fsm_txn_count, the transactions the state
// machine applied: fleetsync makes every catalog write as one /v1/txn, so
// this counts its catalog writes apart from other Raft applies (sessions and
// KV writes of its cluster-id claim are consul_fsm_session_count and
// consul_fsm_kvs_count).
func (c *Consul) CatalogTxns() (float64, error) {
	return c.counter(context.Background(), "consul_fsm_txn_count")
}
