package stack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	consulapi "github.com/hashicorp/consul/api"
)

// consulServerHCL is what every server agent gets besides its flags. Unlike
// the dev agent, a server would call checkpoint.hashicorp.com; Raft runs
// with the timing HashiCorp advises for production (raft_multiplier 1, as
// the dev agent has), so an election takes about a second, not five. A
// server ends without leaving the cluster on SIGTERM (the default, stated).
const consulServerHCL = `disable_update_check = true
disable_anonymous_signature = true
leave_on_terminate = false
performance { raft_multiplier = 1 }`

// start runs the agents of ss together and waits until they are ready,
// retrying on port clashes where a port may change: on the first start
// (every port; the servers' data dirs are wiped before a retry, since the
// Raft configuration names the old ports) and for the dev agent (all but
// its HTTP port). A server's restart keeps every port: its peers know it by
// them.
func (c *Consul) start(ctx context.Context, ss []*ConsulServer, first bool) error {
	ctx, cancel := withStartTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	repick := first || c.dev()
	for attempt := 1; ; attempt++ {
		if repick {
			if err := c.pickPorts(ss, first); err != nil {
				return err
			}
		}
		err := c.launch(ctx, ss)
		if err == nil {
			return nil
		}
		if !repick || !errors.Is(err, errPortTaken) || attempt == startAttempts || ctx.Err() != nil {
			return fmt.Errorf("consul (attempt %d): %w", attempt, err)
		}
		if first {
			if err := c.wipe(ss); err != nil {
				return err
			}
		}
	}
}

// pickPorts gives ss free ports; the HTTP and HTTPS ports (and with them
// the addresses and the Client) only when first.
func (c *Consul) pickPorts(ss []*ConsulServer, first bool) error {
	ports, err := freePorts(5 * len(ss))
	if err != nil {
		return err
	}
	for i, s := range ss {
		p := ports[5*i : 5*i+5]
		s.mu.Lock()
		if first {
			s.ports.http, s.ports.https = p[3], -1
			if c.opts.TLS != nil {
				s.ports.https = p[4]
				s.HTTPSAddr = "127.0.0.1:" + strconv.Itoa(p[4])
			}
		}
		s.ports.server, s.ports.serfLAN, s.ports.serfWAN = p[0], p[1], p[2]
		s.mu.Unlock()
		if first {
			// Set during the first start only, before StartConsul returns.
			s.Addr = "127.0.0.1:" + strconv.Itoa(p[3])
			s.HTTPAddr = "http://" + s.Addr
			cl, err := consulapi.NewClient(&consulapi.Config{Address: s.Addr, Scheme: "http", HttpClient: c.http, Token: c.opts.Token})
			if err != nil {
				return err
			}
			s.Client = cl
		}
	}
	return nil
}

// launch starts the agents of ss and waits until each sees a leader and
// reads its own node consistently. On failure it kills what it started.
func (c *Consul) launch(ctx context.Context, ss []*ConsulServer) (err error) {
	procs := make([]*Process, 0, len(ss))
	defer func() {
		if err != nil {
			for _, p := range procs {
				_ = p.Kill()
			}
		}
	}()
	for _, s := range ss {
		s.mu.Lock()
		name := "consul"
		if !c.dev() {
			name += "-" + strconv.Itoa(s.Index)
		}
		if s.starts > 0 {
			name += "-restart-" + strconv.Itoa(s.starts)
		}
		s.starts++
		s.mu.Unlock()
		p, err := StartProcess(ctx, name, c.bin, append(c.args(s), c.opts.ExtraArgs...), nil, c.Dir)
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	// Leader first, then a consistent read of each agent's own node: by
	// then the leader has established itself (its barrier is through, so
	// writes are applied) and the agent's anti-entropy has run once.
	for _, s := range ss {
		if err := waitFor(ctx, "consul leader seen by "+s.NodeName, procs, c.leaderCheck(s)); err != nil {
			return err
		}
	}
	for _, s := range ss {
		if err := waitFor(ctx, "consul node registration of "+s.NodeName, procs, c.nodeCheck(s)); err != nil {
			return err
		}
	}
	for i, s := range ss {
		s.mu.Lock()
		s.proc = procs[i]
		s.mu.Unlock()
	}
	return nil
}

// args are the agent's flags, ExtraArgs not included.
func (c *Consul) args(s *ConsulServer) []string {
	s.mu.Lock()
	ports := s.ports
	s.mu.Unlock()
	args := []string{"agent"}
	if c.dev() {
		args = append(args, "-dev")
	} else {
		args = append(args, "-server", "-bootstrap-expect="+strconv.Itoa(len(c.servers)), "-data-dir="+s.DataDir,
			"-retry-interval=1s") // the default 30s would outlast a start
		for _, o := range c.servers {
			if o != s {
				o.mu.Lock()
				args = append(args, "-retry-join=127.0.0.1:"+strconv.Itoa(o.ports.serfLAN))
				o.mu.Unlock()
			}
		}
		args = append(args, "-hcl="+consulServerHCL)
	}
	args = append(args,
		"-node="+s.NodeName,
		"-bind=127.0.0.1",
		"-client=127.0.0.1",
		"-http-port="+strconv.Itoa(ports.http),
		"-https-port="+strconv.Itoa(ports.https),
		"-server-port="+strconv.Itoa(ports.server),
		"-serf-lan-port="+strconv.Itoa(ports.serfLAN),
		"-serf-wan-port="+strconv.Itoa(ports.serfWAN),
		"-dns-port=-1",
		"-grpc-port=-1",
		"-grpc-tls-port=-1",
		"-hcl="+consulTelemetry,
		"-log-level=info",
	)
	if c.opts.TLS != nil {
		args = append(args, "-hcl="+c.opts.TLS.consulHCL())
	}
	if c.opts.ACL {
		args = append(args, fmt.Sprintf(`-hcl=acl { enabled = true default_policy = "deny" tokens { initial_management = %q agent = %q } }`, c.opts.Token, c.opts.Token))
	}
	return args
}

func (c *Consul) leaderCheck(s *ConsulServer) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		code, body, err := httpGet(ctx, c.http, s.HTTPAddr+"/v1/status/leader", c.opts.Token)
		if err != nil {
			return false, err
		}
		leader := strings.Trim(strings.TrimSpace(body), `"`)
		return code == http.StatusOK && leader != "", fmt.Errorf("/v1/status/leader: %d %q", code, body)
	}
}

func (c *Consul) nodeCheck(s *ConsulServer) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		code, body, err := httpGet(ctx, c.http, s.HTTPAddr+"/v1/catalog/node/"+s.NodeName+"?consistent", c.opts.Token)
		if err != nil {
			return false, err
		}
		return code == http.StatusOK && strings.Contains(body, `"Node"`) && body != "null", fmt.Errorf("/v1/catalog/node: %d %.200s", code, body)
	}
}
