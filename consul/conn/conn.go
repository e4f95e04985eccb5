package conn

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// The environment variables of the default namespace and partition, as
// consul/api names them (Consul's CLI reads them too).
const (
	NamespaceEnv = api.HTTPNamespaceEnvName
	PartitionEnv = api.HTTPPartitionEnvName
)

// DefaultRequestTimeout bounds each request to Consul unless configured
// otherwise (the store's Options.RequestTimeout, the claim's, Health's).
const DefaultRequestTimeout = 10 * time.Second

// Config is how to reach Consul: the --consul-* connection flags. Each
// field left empty keeps what consul/api's DefaultConfig reads from the
// CONSUL_* variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...).
type Config struct {
	// Addresses are [http(s)://]host:port; Open uses the first, Dial
	// fails over between all (see Servers).
	Addresses     []string
	Token         string
	TokenFile     string
	CAFile        string
	CAPem         []byte // the CA bundle itself, when CAFile is empty
	CertFile      string
	KeyFile       string
	TLSServerName string
	SSL           bool   // https
	Datacenter    string // default $CONSUL_DATACENTER, else the agent's own
	// Compression asks Consul to gzip its answers. Off by default: Consul
	// compresses every answer it is asked to (a restart's read of 100,000
	// instances is ~160 MB of JSON), which costs its CPU more than the
	// bytes cost a local network.
	Compression bool
}

// apiConfig starts from consul/api's DefaultConfig (the CONSUL_* variables)
// and applies the fields that are set.
func (cc Config) apiConfig() *api.Config {
	c := api.DefaultConfig()
	if len(cc.Addresses) > 0 {
		c.Address = cc.Addresses[0]
	}
	// The namespace and partition go on each op and read (Scope), not
	// on every request of the client (logins, sessions, status).
	c.Namespace, c.Partition = "", ""
	c.Datacenter = cc.Datacenter
	if c.Datacenter == "" {
		c.Datacenter = os.Getenv("CONSUL_DATACENTER")
	}
	if cc.Token != "" {
		c.Token = cc.Token
	}
	if cc.TokenFile != "" {
		c.TokenFile = cc.TokenFile
	}
	if cc.CAFile != "" {
		c.TLSConfig.CAFile = cc.CAFile
	} else if len(cc.CAPem) > 0 {
		c.TLSConfig.CAPem = cc.CAPem
	}
	if cc.CertFile != "" {
		c.TLSConfig.CertFile = cc.CertFile
	}
	if cc.KeyFile != "" {
		c.TLSConfig.KeyFile = cc.KeyFile
	}
	if cc.TLSServerName != "" {
		c.TLSConfig.Address = cc.TLSServerName
	}
	if cc.SSL {
		c.Scheme = "https"
	}
	c.Transport.DisableCompression = !cc.Compression
	return c
}

// SplitAddresses splits addresses (or, when there are none, def) into
// host:port and the scheme they ask for ("" when none has one); every
// address that names a scheme must name the same one.
func SplitAddresses(addresses []string, def string) (addrs []string, scheme string, err error) {
	if len(addresses) == 0 {
		addresses = []string{def}
	}
	for _, v := range addresses {
		s := ""
		switch {
		case strings.HasPrefix(v, "https://"):
			s, v = "https", strings.TrimPrefix(v, "https://")
		case strings.HasPrefix(v, "http://"):
			s, v = "http", strings.TrimPrefix(v, "http://")
		}
		v = strings.TrimSuffix(v, "/")
		if s != "" && scheme != "" && s != scheme {
			return nil, "", fmt.Errorf("--consul-address: every address must use the same scheme (%s and %s given)", scheme, s)
		}
		if s != "" {
			scheme = s
		}
		addrs = append(addrs, v)
	}
	return addrs, scheme, nil
}

// Conn is a connection to Consul: the consul/api client and, for the
// daemon (Dial), the token source and the failover set. Everything that
// reads or writes Consul is built from it; nothing outside this package
// holds the consul/api client.
type Conn struct {
	cfg      *api.Config
	api      *api.Client
	tokens   *TokenSource // nil for Open
	servers  *Servers     // nil for Open
	warnings []string     // InsecureTLSWarnings, from the configuration as given
	url      string
	tls      bool
	file     string // the token file, if any
	dc       string
}

// Open returns a plain connection to the first address (or CONSUL_HTTP_ADDR)
// with the configured or CONSUL_HTTP_TOKEN token: what the operator
// commands (status, purge) use.
func Open(cc Config) (*Conn, error) {
	cfg := cc.apiConfig()
	c, err := api.NewClient(cfg) // moves an https:// prefix of the address into the scheme
	if err != nil {
		return nil, fmt.Errorf("consul client: %w", err)
	}
	cn := newConn(cfg, cfg.Address)
	cn.api = c
	return cn, nil
}

// newConn describes the connection cfg configures to address addr.
func newConn(cfg *api.Config, addr string) *Conn {
	scheme := cfg.Scheme
	if scheme == "" {
		scheme = "http"
	}
	return &Conn{cfg: cfg, warnings: insecureTLSWarnings(cfg), url: scheme + "://" + addr,
		tls: cfg.Scheme == "https", file: cfg.TokenFile, dc: cfg.Datacenter}
}

// DialOptions configure Dial.
type DialOptions struct {
	// Login, when set, gets the token by logging in with an auth method
	// (see LoginConfig): the configured and CONSUL_HTTP_TOKEN* tokens are
	// not used. Call Conn.Login before the first request.
	Login *LoginConfig
	Log   hclog.Logger
	// PingAfter and PingTimeout are the HTTP/2 health check (defaults
	// DefaultPingAfter and DefaultPingTimeout).
	PingAfter, PingTimeout time.Duration
}

// Over HTTP/2 every request shares a few connections, and a request that
// times out leaves its connection open for the next ones: one whose peer
// is gone without a reset (a dropped route, a NAT entry expired) would
// swallow every request until the kernel gives up on it, many minutes
// later. So a connection that has read nothing for DefaultPingAfter is
// sent a PING, and closed when no answer comes within DefaultPingTimeout;
// its requests fail over and new ones get a new connection.
const (
	DefaultPingAfter   = 10 * time.Second
	DefaultPingTimeout = 5 * time.Second
)

// Dial returns the daemon's connection: requests fail over between the
// addresses (see Servers) and carry the token of a TokenSource (a static
// token, a token file read again while running, or a login).
func Dial(ctx context.Context, cc Config, opts DialOptions) (*Conn, error) {
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	cfg := cc.apiConfig()
	cfg.Transport.HTTP2 = &http.HTTP2Config{SendPingTimeout: cmp.Or(opts.PingAfter, DefaultPingAfter), PingTimeout: cmp.Or(opts.PingTimeout, DefaultPingTimeout)}
	addrs, scheme, err := SplitAddresses(cc.Addresses, cfg.Address)
	if err != nil {
		return nil, err
	}
	if scheme != "" {
		cfg.Scheme = scheme
	}
	servers, err := NewServers(ctx, addrs, ServersOptions{Log: opts.Log.Named("consul-servers"), Scheme: cfg.Scheme})
	if err != nil {
		return nil, fmt.Errorf("--consul-address: %w", err)
	}
	token, tokenFile := cfg.Token, cfg.TokenFile
	if opts.Login != nil {
		token, tokenFile = "", "" // a login wins over $CONSUL_HTTP_TOKEN*
		cfg.Token, cfg.TokenFile = "", ""
	}
	cn := newConn(cfg, addrs[0]) // before NewAPIClient takes the token out of cfg
	if cn.tokens, err = NewTokenSource(token, tokenFile, opts.Log.Named("consul-token")); err != nil {
		return nil, err
	}
	cn.servers = servers
	if cn.api, err = NewAPIClient(cfg, cn.tokens, servers); err != nil {
		return nil, fmt.Errorf("consul client: %w", err)
	}
	if opts.Login != nil {
		cn.tokens.UseLogin(cn.api, *opts.Login)
	}
	return cn, nil
}

// Wire is what the catalog store sends its reads and transactions
// through: this connection's client, with the raw reads of its HTTP
// client (its token and failover transports).
func (cn *Conn) Wire() wire.API { return wire.API{C: cn.api, Raw: wire.NewRaw(cn.cfg)} }

// NewHealth returns a tracker of whether Consul answers (nil clk: the real
// clock).
func (cn *Conn) NewHealth(clk clock.Clock) *Health { return NewHealth(cn.api, clk) }

// API is the connection's consul/api client, for the packages under
// consul/ (the claim, the operator commands); nothing else holds it.
func (cn *Conn) API() *api.Client { return cn.api }

// Permissions checks the token has each of want in partition (see
// Permissions).
func (cn *Conn) Permissions(ctx context.Context, partition string, want []Permission) error {
	return Permissions(ctx, cn.cfg.HttpClient, cn.cfg, partition, want)
}

// Tokens is the token source of a Dial connection (nil for Open).
func (cn *Conn) Tokens() *TokenSource { return cn.tokens }

// Addresses are the addresses requests go to.
func (cn *Conn) Addresses() []string {
	if cn.servers != nil {
		return cn.servers.Addresses()
	}
	return []string{cn.cfg.Address}
}

// URL is scheme://address of the first address, for messages.
func (cn *Conn) URL() string { return cn.url }

// TLS reports whether requests use https.
func (cn *Conn) TLS() bool { return cn.tls }

// TokenFile is the configured token file ("" for none), for the log.
func (cn *Conn) TokenFile() string { return cn.file }

// Datacenter is the datacenter requests are for: the configured one, else
// (a Dial connection, after Start) the addresses' own; "" for the agent's
// own.
func (cn *Conn) Datacenter() string {
	if cn.servers != nil {
		if dc := cn.servers.Datacenter(); dc != "" {
			return dc
		}
	}
	return cn.dc
}

// RunServers keeps a Dial connection's addresses after Start (see
// Servers.Run): it checks those that did not answer at start and goes back
// to the first once it answers again. It returns nil when ctx is done (at
// once for an Open connection).
func (cn *Conn) RunServers(ctx context.Context) error {
	if cn.servers == nil {
		return nil
	}
	return cn.servers.Run(ctx)
}

// InsecureTLSWarnings returns one sentence per setting of the connection
// that leaves it open to whoever is on its path (see insecureTLSWarnings).
func (cn *Conn) InsecureTLSWarnings() []string { return cn.warnings }
