package watch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"k8s.io/utils/clock"
)

// Options configure a Client.
type Options struct {
	// Wait is the blocking queries' wait (default 5m; Consul caps it at 10m).
	Wait time.Duration
	// MaxStale bounds the staleness of an answer (default 5s; negative:
	// always ask the leader).
	MaxStale time.Duration
	// Datacenter, Namespace and Partition of the reads ("": the
	// connection's own).
	Datacenter, Namespace, Partition string
	// MaxWatches caps the health queries that block at once (0: no cap);
	// past it a health query polls every PollEvery (default 5s).
	MaxWatches int
	PollEvery  time.Duration
	// Full, when set, is told the first time the cap is reached.
	Full func()
	// FeedError, when set, is told every failed read of the change feed
	// and how many failed in a row (see Client.Run); a feed answer whose
	// node reads fail counts once.
	FeedError func(err error, failures int)
	// Restored, when set, is told every time Consul's state is found to
	// have gone back (a snapshot restore; see restores): every blocking
	// query then reads from scratch.
	Restored func()
	// ReadTimeout ends a read Consul does not answer (default 30s, a
	// deadline on the read's context, long enough for a Consul that
	// answers thousands of first reads at once over HTTP/2); a blocking
	// query has Wait and Consul's jitter (Wait/16) on top.
	ReadTimeout time.Duration
	Clock       clock.Clock // default: real
	// Jitter spreads the polls (default math/rand/v2.Float64; tests
	// inject a fixed value).
	Jitter func() float64
}

// Client sends the blocking queries. It is safe for concurrent use.
type Client struct {
	api   *api.Client
	opts  Options
	slots *slots // nil: no cap
	// restores finds restores of Consul's state and aborts the blocking
	// queries they would leave stale.
	restores *restores
	// blocking counts the health queries that block without a cap (with
	// one, slots counts them).
	blocking atomic.Int64
}

// New returns a Client of c (the daemon's connection: its token, TLS and
// failover are used as they are).
func New(c *api.Client, opts Options) *Client {
	if opts.Wait <= 0 {
		opts.Wait = 5 * time.Minute
	}
	if opts.MaxStale == 0 {
		opts.MaxStale = 5 * time.Second
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = 30 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	cl := &Client{api: c, opts: opts, restores: newRestores(opts.Clock, opts.Restored)}
	if opts.MaxWatches > 0 {
		if opts.PollEvery <= 0 {
			opts.PollEvery = 5 * time.Second
		}
		if opts.Jitter == nil {
			opts.Jitter = rand.Float64
		}
		// Polls read at once: a sixteenth of the cap (8 at least), so
		// that blocking queries and polls stay within MaxWatches*17/16.
		cl.slots = &slots{max: int64(opts.MaxWatches), every: opts.PollEvery, clock: opts.Clock, full: opts.Full,
			reads: make(chan struct{}, max(8, opts.MaxWatches/16)), jitter: opts.Jitter,
			waiting: map[string]map[chan struct{}]struct{}{}, started: make(chan struct{})}
	}
	return cl
}

// Node is the node of an entry.
type Node struct {
	Name            string
	Address         string
	Meta            map[string]string
	TaggedAddresses map[string]string
}

// Entry is one service instance with its node and the aggregate state of
// its checks.
type Entry struct {
	Node    Node
	ID      string
	Service string
	Kind    string // "" for a typical service; connect-proxy, mesh-gateway, ...
	Address string // "" when the instance uses its node's
	Port    int
	Tags    []string
	Meta    map[string]string
	// TaggedAddresses are the service's tagged addresses (lan_ipv4,
	// wan, ...), address only.
	TaggedAddresses map[string]string
	Status          string // StatusPassing, StatusWarning, StatusCritical or StatusMaintenance
}

// Aggregate states of an instance's checks.
const (
	StatusPassing     = "passing"
	StatusWarning     = "warning"
	StatusCritical    = "critical"
	StatusMaintenance = "maintenance"
)

// query returns the options of one read and done, which must be called
// with the read's error once it returned: a read that Consul does not
// answer within ReadTimeout (plus Wait and Consul's jitter, Wait/16, for a
// blocking one) is ended, and done names that in its error. Reads past
// the cap share a few connections (see slots): one that hung would hold
// one of them for as long as the connection lives.
func (c *Client) query(ctx context.Context, index uint64, stale bool) (q *api.QueryOptions, done func(error) error) {
	limit := c.opts.ReadTimeout
	if index > 0 {
		limit += c.opts.Wait + c.opts.Wait/16
	}
	timedOut := fmt.Errorf("no answer within %s", limit)
	rctx, cancel := context.WithTimeoutCause(ctx, limit, timedOut)
	q = &api.QueryOptions{WaitIndex: index, WaitTime: c.opts.Wait, AllowStale: stale,
		Datacenter: c.opts.Datacenter, Namespace: c.opts.Namespace, Partition: c.opts.Partition}
	return q.WithContext(rctx), func(err error) error {
		defer cancel()
		if err != nil && ctx.Err() == nil && context.Cause(rctx) == timedOut {
			return fmt.Errorf("%w: %w", timedOut, err)
		}
		return err
	}
}

// tooStale reports whether an answer must be asked again of the leader.
func (c *Client) tooStale(m *api.QueryMeta) bool {
	return m != nil && c.opts.MaxStale > 0 && m.LastContact > c.opts.MaxStale
}

// Catalog is one answer of the catalog's service names.
type Catalog struct {
	Names map[string][]string // service name -> tags
	// FilteredByACLs is true when Consul left names out that the token may
	// not read: the answer is not the whole catalog.
	FilteredByACLs bool
}

// Services returns every service name in the catalog and its tags, once the
// catalog's index differs from index (at once for 0), or Wait passed. A
// return that is no change is checked by a read from scratch from the
// leader, which finds a restore of Consul's state (see restores); one
// before half the wait passed is taken for a restore.
func (c *Client) Services(ctx context.Context, index uint64) (Catalog, uint64, error) {
	read := func(ctx context.Context, index uint64, stale bool) (map[string][]string, *api.QueryMeta, error) {
		q, done := c.query(ctx, index, stale)
		m, meta, err := c.api.Catalog().Services(q)
		return m, meta, done(err)
	}
	start := c.opts.Clock.Now()
	m, meta, err := ask(ctx, c, index, c.opts.MaxStale > 0, read)
	if err == nil && index != 0 && meta.LastIndex == index {
		early := c.opts.Clock.Since(start) < c.opts.Wait/2
		m, meta, err = ask(ctx, c, 0, false, read)
		if err == nil {
			c.restores.catalogRead(meta.LastIndex, early)
		}
	} else if err == nil {
		c.restores.catalogSeen(meta.LastIndex)
	}
	if err != nil {
		return Catalog{}, 0, fmt.Errorf("consul catalog services: %w", err)
	}
	if m == nil {
		m = map[string][]string{}
	}
	return Catalog{Names: m, FilteredByACLs: meta.ResultsFilteredByACLs}, meta.LastIndex, nil
}

// Instances is one answer of a service's health read.
type Instances struct {
	Entries []Entry // sorted by node and ID
	// FilteredByACLs is true when Consul says it left instances out that
	// the token may not read (it lost service:read on the service, or
	// node:read on their nodes): the answer is not the whole service.
	FilteredByACLs bool
	// Streamed is true for an answer of Consul's streaming backend (a
	// blocking read with an index, Consul >= 1.10 with
	// use_streaming_backend, the default). That backend drops what the
	// token may not read without saying so: FilteredByACLs is always
	// false there, and only a read with index 0 (answered by the RPC
	// backend) tells.
	Streamed bool
}

// Health returns the instances of service name with their nodes and
// checks, once the service's index differs from index (at once for 0), or
// Wait passed. Entries are sorted by node and ID.
func (c *Client) Health(ctx context.Context, name string, index uint64) (Instances, uint64, error) {
	return c.HealthQuery(ctx, name, Query{}, index)
}

func entryOf(e *api.ServiceEntry) Entry {
	s := e.Service
	tagged := map[string]string{}
	for k, v := range s.TaggedAddresses {
		tagged[k] = v.Address
	}
	return Entry{
		Node: Node{Name: e.Node.Node, Address: e.Node.Address, Meta: e.Node.Meta, TaggedAddresses: e.Node.TaggedAddresses},
		ID:   s.ID, Service: s.Service, Kind: string(s.Kind), Address: s.Address, Port: s.Port,
		Tags: s.Tags, Meta: s.Meta, TaggedAddresses: tagged, Status: Aggregate(e.Checks),
	}
}

// Aggregate is the state of an instance from its checks and its node's:
// maintenance when the service or node is in maintenance mode, else the
// worst status (critical, warning, passing); passing without checks.
func Aggregate(checks api.HealthChecks) string {
	worst := StatusPassing
	for _, c := range checks {
		if c == nil {
			continue
		}
		if strings.HasPrefix(c.CheckID, "_service_maintenance:") || c.CheckID == "_node_maintenance" {
			return StatusMaintenance
		}
		switch c.Status {
		case api.HealthCritical:
			worst = StatusCritical
		case api.HealthWarning:
			if worst == StatusPassing {
				worst = StatusWarning
			}
		}
	}
	return worst
}
