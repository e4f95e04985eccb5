package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// Applied is what a (possibly partial) Apply wrote.
type Applied struct {
	Written []Registered // instances now in Consul, with their new indexes
	Deleted []string     // IDs of instances removed
	Txns    int          // transactions committed
	Ops     int          // operations committed, node ops included
	// Counts of instances by kind, committed.
	Registered, Updated, Deregistered int
}

// group is the ops of one instance; they always share a transaction.
type group struct {
	ops   api.TxnOps
	bytes int
	kind  int         // kindRegister, kindUpdate, kindDeregister or kindMove
	node  string      // where the instance is, or goes
	want  Instance    // register and update
	have  *Registered // update and deregister
}

// id is the ID of the entry the group writes or deletes.
func (g group) id() string {
	if g.want.ID != "" {
		return g.want.ID
	}
	if g.have != nil {
		return g.have.ID
	}
	return ""
}

const (
	kindRegister = iota
	kindUpdate
	kindDeregister
	kindMove // deregistered and registered again under the same ID (renamed or on another node)
)

// Apply writes ch as few transactions as the limits allow: registrations
// first, then updates, then deregistrations, so the instances in Consul
// never dip below the desired ones while a large change goes out in several
// transactions (or when a later one fails). It returns what was committed
// even when a later transaction fails; the error matches ErrConflict when a
// CAS failed (a *TxnError says which instances or nodes), ErrRefused when
// ownership refused an input or a node named like ours is foreign (then
// nothing at all is sent), ErrClaimLost when the guard says this process
// may not write.
func (c *Client) Apply(ctx context.Context, ch Change) (Applied, error) {
	permit := ch.Permit
	defer func() { permit.Release() }()
	if brokenNoDelete {
		ch.Deregister = nil // the soak's broken build: see broken_off.go
	}
	groups, err := c.plan(ch)
	if err != nil {
		return Applied{}, err
	}
	var done Applied
	for first := true; len(groups) > 0; first = false {
		if !first || permit.b == nil {
			permit.Release()
			if permit, err = c.Acquire(ctx, ch.High); err != nil {
				return done, err
			}
		}
		n, nodes := c.pack(groups)
		resp, err := c.commitGroups(ctx, groups[:n], nodes)
		if err != nil {
			var te *TxnError
			if !errors.As(err, &te) {
				// No answer: the transaction may have committed; its
				// entries witness nothing any more (a delete that
				// committed would read as a loss).
				for _, g := range groups[:n] {
					c.nodes.unwitness(g.id())
				}
			}
			return done, err
		}
		done.Txns++
		done.Ops += len(nodes) + opsOf(groups[:n])
		c.collect(groups[:n], resp, &done)
		for _, g := range groups[:n] {
			switch g.kind {
			case kindRegister:
				done.Registered++
			case kindUpdate:
				done.Updated++
			case kindMove:
				done.Deregistered++
				done.Registered++
			default:
				done.Deregistered++
			}
		}
		groups = groups[n:]
	}
	return done, nil
}

// pack returns how many of groups fit in one transaction and the nodes it
// touches (one node op each, before the service ops: Consul needs the node
// to exist). One guard op is kept free.
func (c *Client) pack(groups []group) (int, []string) {
	n, bytes, ops := 0, 0, 1 // one op kept for the guard
	var nodes []string
	inTxn := map[string]bool{}
	for n < len(groups) {
		g := groups[n]
		extra := 0
		if !inTxn[g.node] {
			extra = 1
		}
		if ops+extra+len(g.ops) > c.opts.MaxOps || (n > 0 && bytes+g.bytes > c.opts.MaxBytes) {
			break
		}
		if extra == 1 {
			inTxn[g.node] = true
			nodes = append(nodes, g.node)
		}
		ops += extra + len(g.ops)
		bytes += g.bytes
		n++
	}
	return n, nodes
}

func opsOf(groups []group) int {
	n := 0
	for _, g := range groups {
		n += len(g.ops)
	}
	return n
}

func (c *Client) plan(ch Change) ([]group, error) {
	var regs, updates, dels []group
	// An ID both deregistered and registered (a renamed instance, or one on
	// another node than it belongs) is one group: its delete and its new
	// registration share a transaction, so it never leaves the catalog.
	registering := make(map[string]bool, len(ch.Register))
	for _, in := range ch.Register {
		registering[in.ID] = true
	}
	moving := map[string]*api.TxnOp{}
	for _, r := range ch.Deregister {
		if err := c.owner.Owns(r); err != nil {
			return nil, fmt.Errorf("%w: deregister %s: %w", ErrRefused, r.ID, err)
		}
		del := &api.TxnOp{Service: &api.ServiceTxnOp{
			Verb: api.ServiceDeleteCAS, Node: r.Node,
			Service: api.AgentService{ID: r.ID, Service: r.Name, ModifyIndex: r.ServiceIndex,
				Namespace: c.namespaceOf(r), Partition: c.opts.Scope.normal().Partition},
		}}
		if registering[r.ID] {
			moving[r.ID] = del
			continue
		}
		g := newGroup(r.Node, kindDeregister, del)
		g.have = &r
		dels = append(dels, g)
	}
	for _, u := range ch.Update {
		if err := c.owner.Owns(u.Have); err != nil {
			return nil, fmt.Errorf("%w: update %s: %w", ErrRefused, u.Have.ID, err)
		}
		if err := c.owner.Stamped(u.Want); err != nil {
			return nil, fmt.Errorf("%w: update %s: %w", ErrRefused, u.Want.ID, err)
		}
		if u.Want.ID != u.Have.ID {
			return nil, fmt.Errorf("%w: update changes instance id %s to %s", ErrRefused, u.Have.ID, u.Want.ID)
		}
		// The service op is a CAS on the index read even when only the
		// check changes: it rewrites nothing (Consul skips an identical
		// service), but it fails if someone re-registered the entry since,
		// so a check is never set on an entry that is no longer ours.
		ops := []*api.TxnOp{c.serviceOp(u.Have.Node, u.Want, u.Have.ServiceIndex)}
		if u.Want.Check != u.Have.Check || !u.Have.HasCheck || u.Want.Name != u.Have.Name {
			ops = append(ops, c.checkOp(u.Have.Node, u.Want, u.Have.CheckIndex))
		}
		g := newGroup(u.Have.Node, kindUpdate, ops...)
		g.want, g.have = u.Want, &u.Have
		updates = append(updates, g)
	}
	nodeFor := c.owner.NodeNameFor
	if ch.NodeFor != nil {
		nodeFor = ch.NodeFor
	}
	for _, in := range ch.Register {
		if err := c.owner.Stamped(in); err != nil {
			return nil, fmt.Errorf("%w: register %s: %w", ErrRefused, in.ID, err)
		}
		node := nodeFor(in.ID)
		if !c.owner.IsNode(node) {
			return nil, fmt.Errorf("%w: register %s on node %s, which is not the owner's", ErrRefused, in.ID, node)
		}
		g := newGroup(node, kindRegister, c.serviceOp(node, in, 0), c.checkOp(node, in, 0))
		if del, ok := moving[in.ID]; ok {
			g = newGroup(node, kindMove, del, c.serviceOp(node, in, 0), c.checkOp(node, in, 0))
		}
		g.want = in
		regs = append(regs, g)
	}
	return append(append(regs, updates...), dels...), nil
}

func newGroup(node string, kind int, ops ...*api.TxnOp) group {
	g := group{ops: ops, kind: kind, node: node}
	for _, op := range ops {
		b, _ := json.Marshal(op)
		g.bytes += len(b)
	}
	return g
}

func (c *Client) serviceOp(node string, in Instance, index uint64) *api.TxnOp {
	return &api.TxnOp{Service: &api.ServiceTxnOp{
		Verb: api.ServiceCAS,
		Node: node,
		Service: api.AgentService{
			ID: in.ID, Service: in.Name, Address: in.Address, Port: in.Port,
			Tags: in.Tags, Meta: in.Meta, ModifyIndex: index, Weights: weights(in.Weight),
			Namespace: c.opts.Scope.NamespaceOf(in), Partition: c.opts.Scope.normal().Partition,
		},
	}}
}

func (c *Client) checkOp(node string, in Instance, index uint64) *api.TxnOp {
	return &api.TxnOp{Check: &api.CheckTxnOp{
		Verb: api.CheckCAS,
		Check: api.HealthCheck{
			Node: node, CheckID: CheckID(in.ID), Name: CheckName,
			Status: in.Check.Status, Output: in.Check.Output,
			ServiceID: in.ID, ServiceName: in.Name, Type: "kubernetes",
			ModifyIndex: index,
			Namespace:   c.opts.Scope.NamespaceOf(in), Partition: c.opts.Scope.normal().Partition,
		},
	}}
}

// commitGroups sends one transaction: the guard op, the node ops, then the
// groups' ops. A failed guard is re-checked once (the claim may only have
// changed hands between this cluster's own replicas) before it is returned.
func (c *Client) commitGroups(ctx context.Context, groups []group, nodes []string) (*api.TxnResponse, error) {
	guard := c.currentGuard()
	if guard != nil && c.unsure.Load() {
		// The last request got no answer: Consul may be back without
		// its data (the claim key gone) or restored. Re-check the guard
		// (a read) rather than send a transaction bound to fail.
		if err := guard.Failed(ctx); err != nil {
			return nil, err
		}
	}
	for attempt := 0; ; attempt++ {
		var ops api.TxnOps
		guarded := 0
		if guard != nil {
			op, err := guard.Op()
			if err != nil {
				return nil, err
			}
			ops, guarded = append(ops, op), 1
		}
		nodeOps, created, err := c.nodeOps(ctx, nodes)
		if err != nil {
			return nil, err
		}
		ops = append(ops, nodeOps...)
		for _, g := range groups {
			ops = append(ops, g.ops...)
		}
		resp, err := c.commit(ctx, ops)
		if err == nil {
			c.recordNodes(resp)
			created()
			c.unsure.Store(false)
			return resp, nil
		}
		created()
		var te *TxnError
		if !errors.As(err, &te) {
			// No answer: Consul may come back without its data (or
			// restored), so the nodes and the guard are read again
			// before the next transaction instead of a CAS on what
			// they were.
			c.nodes.forget()
			c.unsure.Store(true)
			return nil, err
		}
		te.locate(ops, guarded, len(nodeOps), groups)
		if len(te.Nodes) > 0 {
			c.nodes.forget() // re-read before the next node op
		}
		if te.Guard {
			if gerr := guard.Failed(ctx); gerr != nil {
				return nil, gerr
			}
			if attempt == 0 {
				continue
			}
		}
		return nil, te
	}
}

func (c *Client) commit(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	start := time.Now()
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	ok, resp, _, err := c.api.Txn(ops, c.opts.Scope.nodeQuery(&api.QueryOptions{}).WithContext(rctx))
	if err == nil && !ok {
		err = txnError(resp)
	}
	if c.opts.Observe != nil {
		c.opts.Observe(len(ops), time.Since(start).Seconds(), err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var te *TxnError
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, fmt.Errorf("consul transaction of %d ops: %w", len(ops), c.ctxErr(ctx, err))
	}
	return resp, nil
}

// recordNodes notes the nodes a committed transaction wrote (their node ops'
// results), for the next node ops.
func (c *Client) recordNodes(resp *api.TxnResponse) {
	if resp == nil {
		return
	}
	for _, r := range resp.Results {
		if r.Node != nil {
			c.nodes.written(r.Node.Node, r.Node.CreateIndex, r.Node.ModifyIndex, r.Node.Address, r.Node.Meta)
		}
	}
}

// collect records what the committed groups wrote: the instance sent, with
// the new indexes from the results (deletes have no result; an entry that
// was not rewritten keeps the index it had).
func (c *Client) collect(groups []group, resp *api.TxnResponse, done *Applied) {
	svcIndex := map[string]uint64{}
	checkIndex := map[string]uint64{}
	if resp != nil {
		for _, r := range resp.Results {
			switch {
			case r.Service != nil:
				svcIndex[r.Service.ID] = r.Service.ModifyIndex
			case r.Check != nil:
				checkIndex[r.Check.CheckID] = r.Check.ModifyIndex
			}
		}
	}
	now := time.Now()
	for _, g := range groups {
		if g.kind != kindDeregister {
			c.nodes.sawIndex(g.node, svcIndex[g.want.ID]) // checks do not raise the node index
		}
		if g.kind == kindDeregister {
			done.Deleted = append(done.Deleted, g.have.ID)
			c.nodes.witnessed(Witness{ID: g.have.ID, At: now})
			continue
		}
		if i := svcIndex[g.want.ID]; i > 0 {
			c.nodes.witnessed(Witness{Node: g.node, ID: g.want.ID, Name: g.want.Name, Index: i, At: now})
		}
		r := Registered{Instance: g.want, Node: g.node, HasCheck: true, Namespace: c.opts.Scope.NamespaceOf(g.want)}
		if g.have != nil {
			r.ServiceIndex, r.CheckIndex = g.have.ServiceIndex, g.have.CheckIndex
		}
		if i, ok := svcIndex[g.want.ID]; ok {
			r.ServiceIndex = i
		}
		if i, ok := checkIndex[CheckID(g.want.ID)]; ok {
			r.CheckIndex = i
		}
		done.Written = append(done.Written, r)
	}
}

// TxnError is a transaction Consul rolled back: which ops failed and why,
// and (located) the instances, nodes and guard they belong to.
type TxnError struct {
	Errors   []api.TxnError
	Conflict bool     // a CAS failed: someone changed an entry since it was read
	IDs      []string // instances whose ops failed
	Nodes    []string // nodes whose op failed
	Guard    bool     // the guard op failed
}

func (e *TxnError) Error() string {
	msgs := make([]string, 0, len(e.Errors))
	for _, x := range e.Errors {
		msgs = append(msgs, fmt.Sprintf("op %d: %s", x.OpIndex, x.What))
	}
	var where []string
	if e.Guard {
		where = append(where, "the cluster-id claim check")
	}
	if len(e.Nodes) > 0 {
		where = append(where, "node "+strings.Join(e.Nodes, ", "))
	}
	if len(e.IDs) > 0 {
		ids := e.IDs
		if len(ids) > 5 {
			ids = append(ids[:5:5], fmt.Sprintf("and %d more", len(e.IDs)-5))
		}
		where = append(where, "instance "+strings.Join(ids, ", "))
	}
	prefix := "transaction rolled back"
	if e.Conflict {
		prefix = ErrConflict.Error()
	}
	if len(where) > 0 {
		prefix += " (" + strings.Join(where, "; ") + ")"
	}
	if len(msgs) == 0 {
		return prefix + ": no errors given"
	}
	return prefix + ": " + strings.Join(msgs, "; ")
}

func (e *TxnError) Is(target error) bool { return e.Conflict && target == ErrConflict }

// locate maps the failed op indexes to the guard, the nodes and the
// instances of the transaction (guarded guard ops, then nodes node ops,
// then the groups' ops in order).
func (e *TxnError) locate(ops api.TxnOps, guarded, nodes int, groups []group) {
	owner := make([]string, 0, len(ops))
	for range guarded {
		owner = append(owner, "")
	}
	for i := range nodes {
		owner = append(owner, ops[guarded+i].Node.Node.Node)
	}
	for _, g := range groups {
		id := g.want.ID
		if g.have != nil {
			id = g.have.ID
		}
		for range g.ops {
			owner = append(owner, id)
		}
	}
	seenID, seenNode := map[string]bool{}, map[string]bool{}
	for _, x := range e.Errors {
		i := x.OpIndex
		switch {
		case i < 0 || i >= len(owner):
		case i < guarded:
			e.Guard = true
		case i < guarded+nodes:
			if !seenNode[owner[i]] {
				seenNode[owner[i]] = true
				e.Nodes = append(e.Nodes, owner[i])
			}
		default:
			if !seenID[owner[i]] {
				seenID[owner[i]] = true
				e.IDs = append(e.IDs, owner[i])
			}
		}
	}
	// A failed guard or node op makes the others fail too (their node is
	// missing, say): those are not separate findings.
	if e.Guard || len(e.Nodes) > 0 {
		e.IDs = nil
	}
	if e.Guard {
		e.Conflict = true // the claim key changed since it was read
	}
}

func txnError(resp *api.TxnResponse) error {
	te := &TxnError{}
	if resp != nil {
		for _, x := range resp.Errors {
			te.Errors = append(te.Errors, *x)
			if isCASFailure(x.What) {
				te.Conflict = true
			}
		}
	}
	return te
}

func isCASFailure(what string) bool {
	w := strings.ToLower(what)
	return strings.Contains(w, "cas") || strings.Contains(w, "index is stale") ||
		strings.Contains(w, "does not exist") || strings.Contains(w, "already exists")
}

// weights is what an instance's Weight is written as: nothing (Consul's
// default) for 0, else Passing=w with Consul's default Warning weight (1).
func weights(w int) api.AgentWeights {
	if w <= 0 {
		return api.AgentWeights{}
	}
	return api.AgentWeights{Passing: w, Warning: 1}
}

// weightOf is the inverse of weights for an entry read back.
func weightOf(w api.AgentWeights) int {
	if w.Passing <= 1 {
		return 0
	}
	return w.Passing
}

// namespaceOf is the namespace of an entry read: where Consul said it is,
// else where the scope puts it.
func (c *Client) namespaceOf(r Registered) string {
	if r.Namespace != "" && r.Namespace != "default" {
		return r.Namespace
	}
	return c.opts.Scope.NamespaceOf(r.Instance)
}
