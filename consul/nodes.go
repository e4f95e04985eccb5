package consul

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/consul/api"
)

// ErrForeignNode is matched (errors.Is) by the error Apply returns, before
// anything is sent, when an instance would go on a node that has the
// owner's name but not its mark: someone else registered it, and a node op
// would replace their node record.
var ErrForeignNode = errors.New("consul: node named like ours is not ours")

// ForeignNodeError names the look-alike node and what it holds.
type ForeignNodeError struct {
	Node    string
	Address string
	Meta    map[string]string
}

func (e *ForeignNodeError) Error() string {
	return fmt.Sprintf("node %s exists in Consul without this cluster's mark (address %s, meta %s): it belongs to someone else, so fleetsync writes nothing onto it; remove or rename it to sync the Services placed on it",
		e.Node, e.Address, metaString(e.Meta))
}

func (e *ForeignNodeError) Is(target error) bool {
	return target == ErrForeignNode || target == ErrRefused
}

// NodeEntry is one node named like the owner's, as the catalog holds it.
type NodeEntry struct {
	Name                     string
	Address                  string
	Meta                     map[string]string
	CreateIndex, ModifyIndex uint64
	Ours                     bool // carries the owner's mark
}

// NodesView is one read of every node named like the owner's.
type NodesView struct {
	Nodes []NodeEntry // sorted by name
	// Index is the catalog index Consul answered with (X-Consul-Index).
	Index uint64
}

// Foreign returns the look-alike nodes.
func (v NodesView) Foreign() []NodeEntry {
	var out []NodeEntry
	for _, n := range v.Nodes {
		if !n.Ours {
			out = append(out, n)
		}
	}
	return out
}

// nodeRegistry is what the client knows of the nodes it writes to: a node
// op is a CAS on the ModifyIndex last seen (0: create only if absent), so a
// node that someone else created or changed meanwhile fails the transaction
// instead of being replaced.
type nodeRegistry struct {
	mu    sync.Mutex
	known bool
	nodes map[string]NodeEntry // by name; absent: not in the catalog
	// creating holds, per node being created by a transaction in flight,
	// a channel closed when it is done: other transactions wait for it
	// rather than race it (a CAS create that fails is a wasted write).
	creating map[string]chan struct{}
	// high is, per node, the highest index a committed transaction
	// returned for an entry on it: the node's catalog index cannot be
	// below it unless Consul lost or rolled back data.
	high map[string]uint64
	// witnesses are the latest committed service writes, newest last.
	witnesses []Witness
}

func (r *nodeRegistry) sawIndex(node string, i uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.high == nil {
		r.high = map[string]uint64{}
	}
	r.high[node] = max(r.high[node], i)
}

// highest is the highest index a committed transaction returned, on any
// node.
func (r *nodeRegistry) highest() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var m uint64
	for _, i := range r.high {
		m = max(m, i)
	}
	return m
}

// Committed returns the highest index a committed transaction returned for
// an entry on node (0: none since the start or the last ResetCommitted).
func (c *Client) Committed(node string) uint64 {
	c.nodes.mu.Lock()
	defer c.nodes.mu.Unlock()
	return c.nodes.high[node]
}

// CommittedNodes names the nodes a committed transaction wrote an entry
// on since the start or the last ResetCommitted, sorted.
func (c *Client) CommittedNodes() []string {
	c.nodes.mu.Lock()
	defer c.nodes.mu.Unlock()
	out := make([]string, 0, len(c.nodes.high))
	for n := range c.nodes.high {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ResetCommitted forgets the committed indexes and the nodes known: after
// Consul lost or rolled back its data, history starts again.
func (c *Client) ResetCommitted() {
	c.nodes.mu.Lock()
	c.nodes.high, c.nodes.witnesses = nil, nil
	c.nodes.mu.Unlock()
	c.nodes.forget()
	c.unsure.Store(true) // the claim may be gone too: re-check it first
}

// NodeIndex returns the catalog index of one node: Consul raises it with
// every write to the node, its services or their checks, so it only goes
// down when Consul lost or rolled back data. One small request (a filter
// that matches no service).
func (c *Client) NodeIndex(ctx context.Context, node string) (uint64, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return 0, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	q := c.opts.Scope.instanceQuery(&api.QueryOptions{Filter: `ID == "" and ID != ""`}).WithContext(rctx)
	_, meta, err := c.api.NodeServiceList(node, q)
	if err != nil {
		return 0, fmt.Errorf("read the index of node %s: %w", node, c.ctxErr(ctx, err))
	}
	if meta == nil {
		return 0, nil
	}
	return meta.LastIndex, nil
}

// KVIndex reads key (it need not exist) and returns Consul's KV index,
// which moves only when some KV entry is written: the supervisor's
// snapshot-restore signal (supervisor.Options.StateKey).
func (c *Client) KVIndex(ctx context.Context, key string) (uint64, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return 0, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	_, meta, err := c.api.KVGet(key, c.opts.Scope.kvQuery(&api.QueryOptions{}).WithContext(rctx))
	if err != nil {
		return 0, fmt.Errorf("read the KV index (key %s): %w", key, c.ctxErr(ctx, err))
	}
	if meta == nil {
		return 0, nil
	}
	return meta.LastIndex, nil
}

// ReadNodes lists every node named like the owner's (ours or look-alikes)
// with their indexes, in one request, and records them for the node ops of
// later transactions.
func (c *Client) ReadNodes(ctx context.Context) (NodesView, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return NodesView{}, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	first := c.owner.Node().Name
	q := c.opts.Scope.nodeQuery(&api.QueryOptions{Filter: fmt.Sprintf("Node == %q or Node matches %q", first, "^"+regexp.QuoteMeta(first)+`\.[0-9]+$`)}).WithContext(rctx)
	list, meta, err := c.api.CatalogNodes(q)
	if err != nil {
		return NodesView{}, fmt.Errorf("list the nodes named like %s: %w", first, c.ctxErr(ctx, err))
	}
	view := NodesView{}
	if meta != nil {
		view.Index = meta.LastIndex
	}
	for _, n := range list {
		if !c.owner.IsNode(n.Node) {
			continue // matched the filter but not the owner's naming (e.g. k8s-x.01)
		}
		view.Nodes = append(view.Nodes, NodeEntry{
			Name: n.Node, Address: n.Address, Meta: n.Meta, CreateIndex: n.CreateIndex, ModifyIndex: n.ModifyIndex,
			Ours: c.markedNode(n.Node, n.Meta),
		})
	}
	sort.Slice(view.Nodes, func(i, j int) bool { return view.Nodes[i].Name < view.Nodes[j].Name })
	c.nodes.set(view.Nodes, view.Index)
	return view, nil
}

// markedNode reports whether a node of that name and meta carries the
// owner's mark.
func (c *Client) markedNode(name string, meta map[string]string) bool {
	want := c.owner.NodeNamed(name).Meta
	for k, v := range want {
		if meta[k] != v {
			return false
		}
	}
	return true
}

// set records a read of the nodes, answered at catalog index index. A
// node one of our transactions wrote after that index (or at a higher
// ModifyIndex) is kept as written: the read is older than the write.
func (r *nodeRegistry) set(nodes []NodeEntry, index uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[string]NodeEntry, len(nodes))
	for _, n := range nodes {
		next[n.Name] = n
	}
	for name, w := range r.nodes {
		if !w.Ours {
			continue
		}
		if n, ok := next[name]; (!ok && w.ModifyIndex > index) || (ok && w.ModifyIndex > n.ModifyIndex) {
			next[name] = w
		}
	}
	r.known = true
	r.nodes = next
}

func (r *nodeRegistry) isKnown() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known
}

// written records a node op that committed: the node is ours at index.
func (r *nodeRegistry) written(name string, create, modify uint64, address string, meta map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes == nil {
		r.nodes = map[string]NodeEntry{}
	}
	r.nodes[name] = NodeEntry{Name: name, Address: address, Meta: maps.Clone(meta), CreateIndex: create, ModifyIndex: modify, Ours: true}
}

// forget drops what is known of the nodes (a node op failed, or a request
// got no answer), so the next transaction reads them again and trusts
// that read.
func (r *nodeRegistry) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.known = false
	r.nodes = nil
}

// nodeOps returns the node op of every node in names, reading the nodes
// first when the registry is not filled; a look-alike node refuses. A node
// not in the catalog is created by one transaction at a time: done, called
// once the transaction is over (and its results recorded), lets the next
// one see it.
func (c *Client) nodeOps(ctx context.Context, names []string) (ops api.TxnOps, done func(), err error) {
	for {
		if !c.nodes.isKnown() {
			if _, err := c.ReadNodes(ctx); err != nil {
				return nil, nil, err
			}
		}
		entries, mine, wait := c.nodes.reserve(names)
		if wait != nil {
			// Another transaction creates one of these nodes: wait for
			// it holding no reservation (two transactions never wait for
			// each other), then look again.
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		done = func() { c.nodes.created(mine) }
		ops = make(api.TxnOps, 0, len(names))
		for i, name := range names {
			n, exists := entries[i], entries[i].Name != ""
			if exists && !n.Ours {
				done()
				return nil, nil, &ForeignNodeError{Node: n.Name, Address: n.Address, Meta: n.Meta}
			}
			want := c.owner.NodeNamed(name)
			ops = append(ops, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeCAS, Node: api.Node{
				Node: want.Name, Address: want.Address, Meta: want.Meta, ModifyIndex: n.ModifyIndex, // 0: create only if absent
				Partition: c.opts.Scope.Normal().Partition,
			}}})
		}
		return ops, done, nil
	}
}

// reserve returns the entries of names (zero when absent) and reserves the
// creation of the absent ones, all or none: when another transaction is
// creating one of them, it reserves nothing and returns a channel closed
// when that creation ends.
func (r *nodeRegistry) reserve(names []string) (entries []NodeEntry, mine []string, wait <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	entries = make([]NodeEntry, len(names))
	for i, name := range names {
		if n, ok := r.nodes[name]; ok {
			entries[i] = n
			continue
		}
		if ch, busy := r.creating[name]; busy {
			return nil, nil, ch
		}
	}
	for i, name := range names {
		if entries[i].Name == "" {
			if r.creating == nil {
				r.creating = map[string]chan struct{}{}
			}
			r.creating[name] = make(chan struct{})
			mine = append(mine, name)
		}
	}
	return entries, mine, nil
}

// created ends the creations of names (committed or not).
func (r *nodeRegistry) created(names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range names {
		if ch, ok := r.creating[name]; ok {
			close(ch)
			delete(r.creating, name)
		}
	}
}

func metaString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
