package consul

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"golang.org/x/sync/semaphore"

	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// ErrConflict is matched (errors.Is) by the error Apply returns when a CAS
// operation failed because someone changed the entry since it was read.
var ErrConflict = errors.New("consul: entry changed since it was read (CAS conflict)")

// ErrRefused is matched by the error Apply returns, before anything is sent,
// when the owner refuses an instance or entry.
var ErrRefused = errors.New("consul: refused by ownership")

// catalogAPI is the part of the Consul API the client uses.
type catalogAPI interface {
	NodeServiceList(node string, q *api.QueryOptions) (*api.CatalogNodeServiceList, *api.QueryMeta, error)
	// NodeServices, NodeChecks and ServiceEntries are the reads of owned
	// state, decoded lean (package wire).
	NodeServices(node string, q *api.QueryOptions) (*wire.NodeServices, *api.QueryMeta, error)
	NodeChecks(node string, q *api.QueryOptions) ([]*wire.Check, *api.QueryMeta, error)
	ServiceEntries(name string, q *api.QueryOptions) ([]*wire.Entry, *api.QueryMeta, error)
	// CommitTxn sends ops, whose JSON is body (nil: encode ops).
	CommitTxn(ops api.TxnOps, body []byte, q *api.QueryOptions) (bool, *wire.TxnResponse, error)
	CatalogNode(node string, q *api.QueryOptions) (*api.CatalogNode, *api.QueryMeta, error)
	CatalogNodes(q *api.QueryOptions) ([]*api.Node, *api.QueryMeta, error)
	KVGet(key string, q *api.QueryOptions) (*api.KVPair, *api.QueryMeta, error)
}

// Options tune a Client. Zero values mean the defaults.
type Options struct {
	MaxOps   int // operations per transaction, node op included (default 128)
	MaxBytes int // approximate body bytes per transaction (default 384 KiB)
	// MaxReads bounds concurrent reads (anti-entropy passes of many
	// workers, say); Consul refuses more than 200 connections per client
	// by default. Default 32.
	MaxReads int
	// Budget limits the write rate and concurrency; nil: unlimited.
	Budget *budget.Budget
	// Observe, when set, is called after every transaction with its op count,
	// duration in seconds and error (nil on success).
	Observe func(ops int, seconds float64, err error)
	// ObserveWait, when set, is called with every budget wait.
	ObserveWait func(waited time.Duration, high bool)
	// RequestTimeout bounds every request (default 10s): a Consul that
	// accepts the connection and never answers costs at most this, and
	// frees the request's read or write slot.
	RequestTimeout time.Duration
	// Guard, when set, makes every transaction conditional on it (the
	// cluster-id claim; see Guard).
	Guard Guard
	// Scope is the namespace and partition of every op and read
	// (Consul Enterprise; the zero Scope is Consul OSS's).
	Scope Scope
	// Namespaces, when set, is asked to make each namespace a
	// transaction registers or updates instances in exist before it is
	// sent (nil: the namespaces must exist).
	Namespaces NamespaceEnsurer
	// MarksMaxAge is how long one read of the catalog marks is shared
	// (see CatalogMarks; default MarksMaxAge); negative: every call reads.
	MarksMaxAge time.Duration
	// Now is the clock of the witnesses' times and of the marks' sharing
	// (default time.Now): the loss check compares the witnesses' times
	// with its own clock, which tests fake.
	Now func() time.Time
}

// Guard makes every transaction conditional on something outside the
// catalog: Ops (at most MaxGuardOps of them) are put first in each
// transaction (Consul rolls the whole transaction back when one fails);
// when one failed, Failed checks again and returns nil if writing may go on
// (Apply then retries once with new Ops), or an error that Apply returns.
// Ops returns an error when writing is not allowed at all right now.
type Guard interface {
	Ops() (api.TxnOps, error)
	Failed(ctx context.Context) error
}

// MaxGuardOps is how many ops of each transaction are kept for the
// guard's (the claim's check-index and check-session).
const MaxGuardOps = 2

// Client reads owned state and writes changes. Safe for concurrent use.
type Client struct {
	api   catalogAPI
	owner Owner
	opts  Options
	reads *semaphore.Weighted // bounds concurrent reads (Options.MaxReads)
	nodes nodeRegistry
	guard atomic.Pointer[guardHolder]
	// unsure is set when a transaction got no answer, cleared when one
	// commits: until then each transaction re-checks the guard first.
	unsure atomic.Bool
	marks  marksCache
	checks foreignChecks // what the reads saw of others' checks on our nodes
	now    func() time.Time
}

type guardHolder struct{ g Guard }

// SetGuard sets (or, with nil, removes) the guard of every later
// transaction (see Options.Guard).
func (c *Client) SetGuard(g Guard) {
	if g == nil {
		c.guard.Store(nil)
		return
	}
	c.guard.Store(&guardHolder{g})
}

func (c *Client) currentGuard() Guard {
	if h := c.guard.Load(); h != nil {
		return h.g
	}
	return nil
}

// reqCtx bounds one request by Options.RequestTimeout.
func (c *Client) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.opts.RequestTimeout)
}

// ctxErr explains a request that failed because its own deadline passed
// (the caller's context still live).
//
// Any failed request (the caller's context still live) also makes the next
// transaction read the nodes and re-check the guard first: Consul may be
// back without its data, and a transaction on what it held would fail.
func (c *Client) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		c.unsure.Store(true)
		c.nodes.forget()
	}
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer from Consul within %s (--consul-request-timeout): %w", c.opts.RequestTimeout, err)
	}
	return err
}

// NewClient returns a client of c writing on behalf of owner.
func NewClient(c *api.Client, owner Owner, opts Options) *Client {
	return newClient(wire.API{C: c}, owner, opts)
}

// NewConnClient returns a client of connection cn writing on behalf of
// owner: its reads of owned state and its transactions go through cn's
// own HTTP client without consul/api's decoding (conn.Conn.Wire).
func NewConnClient(cn *conn.Conn, owner Owner, opts Options) *Client {
	return newClient(cn.Wire(), owner, opts)
}

func newClient(a catalogAPI, owner Owner, opts Options) *Client {
	if opts.MaxOps <= 1 {
		opts.MaxOps = defaultMaxOps
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = defaultMaxBytes
	}
	if opts.MaxReads <= 0 {
		opts.MaxReads = 32
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = conn.DefaultRequestTimeout
	}
	if opts.MarksMaxAge == 0 {
		opts.MarksMaxAge = MarksMaxAge
	}
	c := &Client{api: a, owner: owner, opts: opts, reads: semaphore.NewWeighted(int64(opts.MaxReads)),
		marks: marksCache{slot: make(chan struct{}, 1)}, checks: newForeignChecks(), now: opts.Now}
	if c.now == nil {
		c.now = time.Now
	}
	c.SetGuard(opts.Guard)
	return c
}

// ReadNode returns every instance on the owner's nodes, owned or not
// (callers keep only what Owner.Owns accepts). No node is an empty result.
func (c *Client) ReadNode(ctx context.Context) ([]Registered, error) {
	return c.readNodes(ctx, "")
}

// ReadPrefix returns the instances on the owner's nodes whose ID starts
// with prefix, owned or not.
func (c *Client) ReadPrefix(ctx context.Context, prefix string) ([]Registered, error) {
	return c.readNodes(ctx, prefix)
}

// Nodes lists the owner's nodes in the catalog: those with its node meta
// and one of its names (instances stay on the node they were written to
// when the owner's number of nodes changes, so all are read).
func (c *Client) Nodes(ctx context.Context) ([]string, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	q := c.opts.Scope.nodeQuery(&api.QueryOptions{NodeMeta: c.owner.Node().Meta}).WithContext(rctx)
	list, _, err := c.api.CatalogNodes(q)
	if err != nil {
		return nil, fmt.Errorf("list the nodes of %s: %w", c.owner.Node().Name, c.ctxErr(ctx, err))
	}
	var out []string
	for _, n := range list {
		if c.owner.IsNode(n.Node) {
			out = append(out, n.Node)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (c *Client) readNodes(ctx context.Context, prefix string) ([]Registered, error) {
	began := c.checks.begin()
	defer c.checks.end(began)
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out, err := c.readEach(ctx, nodes, prefix)
	if err == nil && prefix == "" {
		c.sawNodes(began, nodes)
	}
	return out, err
}

// read reads the instances on node whose ID starts with prefix ("": all),
// with their readiness checks; it records the foreign checks it saw.
func (c *Client) read(ctx context.Context, node, prefix string) ([]Registered, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	began := c.checks.begin()
	defer c.checks.end(began)
	var svcFilter, checkFilter string
	if prefix != "" {
		re := "^" + regexp.QuoteMeta(prefix)
		svcFilter, checkFilter = fmt.Sprintf("ID matches %q", re), fmt.Sprintf("ServiceID matches %q", re)
	}
	q := c.opts.Scope.instanceQuery(&api.QueryOptions{Filter: svcFilter}).WithContext(rctx)
	list, _, err := c.api.NodeServices(node, q)
	if err != nil {
		return nil, fmt.Errorf("read services of node %s: %w", node, c.ctxErr(ctx, err))
	}
	if list == nil || len(list.Services) == 0 {
		c.sawNode(began, node, prefix, nil) // no instance: none a check there could concern
		return nil, nil
	}
	q = c.opts.Scope.instanceQuery(&api.QueryOptions{Filter: checkFilter}).WithContext(rctx)
	checks, _, err := c.api.NodeChecks(node, q)
	if err != nil {
		return nil, fmt.Errorf("read checks of node %s: %w", node, c.ctxErr(ctx, err))
	}
	// Checks by the ID of the service they name: only our check, whose
	// ID is CheckID(service ID), is the instance's (keys built of the
	// decoded strings: no string is made per entry).
	type nsID struct{ ns, id string }
	byService := make(map[nsID]*wire.Check, len(checks))
	var others []*wire.Check // everyone else's, rare
	for _, hc := range checks {
		if isCheckOf(hc.CheckID, hc.ServiceID) {
			byService[nsID{hc.Namespace, hc.ServiceID}] = hc
		} else {
			others = append(others, hc)
		}
	}
	out := make([]Registered, 0, len(list.Services))
	for _, s := range list.Services {
		out = append(out, fromWire(node, s, byService[nsID{s.Namespace, s.ID}]))
	}
	c.sawNode(began, node, prefix, c.foreignOnNode(node, others, list.Services))
	return out, nil
}

// isCheckOf reports whether checkID is CheckID(serviceID).
func isCheckOf(checkID, serviceID string) bool {
	return len(checkID) == len(checkIDPrefix)+len(serviceID) && checkID[:len(checkIDPrefix)] == checkIDPrefix && checkID[len(checkIDPrefix):] == serviceID
}

// Acquire waits for the write budget of one transaction (see budget.Budget). The
// caller passes the permit in Change.Permit, or releases it.
func (c *Client) Acquire(ctx context.Context, high bool) (budget.Permit, error) {
	p, err := c.opts.Budget.Acquire(ctx, high)
	if err == nil && c.opts.ObserveWait != nil && c.opts.Budget != nil {
		c.opts.ObserveWait(p.Waited, high)
	}
	return p, err
}

// ReadService returns the instances of Consul service name on the owner's
// nodes (by node meta), owned or not, with their readiness checks, and the
// service's index (see ServiceIndex): one index-backed read, cheap enough
// for every worker's periodic anti-entropy pass.
func (c *Client) ReadService(ctx context.Context, name string) ([]Registered, uint64, error) {
	began := c.checks.begin()
	defer c.checks.end(began)
	entries, index, err := c.serviceEntries(ctx, name, "")
	if err != nil {
		return nil, 0, err
	}
	out := make([]Registered, 0, len(entries))
	var seen foreignSeen
	for _, e := range entries {
		if e.Node == nil || !c.owner.IsNode(e.Node.Node) {
			continue
		}
		var hc *wire.Check
		for _, x := range e.Checks {
			if x.CheckID == CheckID(e.Service.ID) && x.ServiceID == e.Service.ID {
				hc = x
			} else {
				seen.add(c, e.Node.Node, x, e.Service)
			}
		}
		seen.node(e.Node.Node)
		out = append(out, fromWire(e.Node.Node, e.Service, hc))
	}
	c.sawService(began, name, seen.nodes, seen.checks)
	return out, index, nil
}

// ServiceIndex returns Consul's index of service name: Consul raises it
// with every write of a service or check of that name, on any node, by
// anyone (TestServiceIndexMovesWithEveryWriteOfTheService), so an index
// equal to the one a ReadService answered means that no entry of that name
// changed since. A request that returns no entry. 0 means unknown (Consul
// Enterprise scopes).
func (c *Client) ServiceIndex(ctx context.Context, name string) (uint64, error) {
	_, index, err := c.serviceEntries(ctx, name, `Service.ID == "" and Service.ID != ""`)
	return index, err
}

func (c *Client) serviceEntries(ctx context.Context, name, filter string) ([]*wire.Entry, uint64, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return nil, 0, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	q := c.opts.Scope.instanceQuery(&api.QueryOptions{NodeMeta: c.owner.Node().Meta, Filter: filter}).WithContext(rctx)
	entries, meta, err := c.api.ServiceEntries(name, q)
	if err != nil {
		return nil, 0, fmt.Errorf("read service %s on the nodes of %s: %w", name, c.owner.Node().Name, c.ctxErr(ctx, err))
	}
	var index uint64
	if meta != nil && !c.opts.Scope.Normal().Enterprise() {
		// With Consul Enterprise namespaces or partitions (mirrored ones
		// read with ns=*) what the index covers is not pinned by a test
		// here: 0 (unknown), so no pass skips its read.
		index = meta.LastIndex
	}
	return entries, index, nil
}
