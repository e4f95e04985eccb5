package consul

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
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
	enc   []byte // ops as JSON, comma-separated: their part of the request (txnBody)
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
// nothing at all is sent), ErrFenced when the change's shard was taken by
// another replica (see Change.Fence), the guard's error when it says this
// process may not write (claim.ErrLost). With Options.Namespaces, the
// namespaces ch registers or updates instances in are made to exist first.
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
	if err := c.ensureNamespaces(ctx, groups); err != nil {
		return Applied{}, err
	}
	var done Applied
	for first := true; len(groups) > 0; first = false {
		if !first || permit.Zero() {
			permit.Release()
			if permit, err = c.Acquire(ctx, ch.High); err != nil {
				return done, err
			}
		}
		n, nodes := c.pack(groups, reserved(ch))
		// From now on the entries are not where their witnesses say (a
		// check reading one as this commits would take our own write
		// for a loss); without an answer they witness nothing at all.
		ids := make([]string, n)
		for i, g := range groups[:n] {
			ids[i] = g.id()
		}
		retired := c.nodes.retire(ids)
		resp, err := c.commitGroups(ctx, groups[:n], nodes, ch.Fence)
		if err != nil {
			if te := (*TxnError)(nil); errors.As(err, &te) {
				c.nodes.reinstate(retired) // refused: nothing committed
			}
			c.namespaceGone(err, groups[:n])
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

// reserved is how many ops of each transaction of ch go to guards:
// MaxGuardOps for the claim, as many again for the shard's fence.
func reserved(ch Change) int {
	if ch.Fence != nil {
		return 2 * MaxGuardOps
	}
	return MaxGuardOps
}

// pack returns how many of groups fit in one transaction and the nodes it
// touches (one node op each, before the service ops: Consul needs the node
// to exist). guards ops are kept free (reserved).
func (c *Client) pack(groups []group, guards int) (int, []string) {
	n, bytes, ops := 0, 0, guards
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
				Namespace: c.namespaceOf(r), Partition: c.opts.Scope.Normal().Partition},
		}}
		if registering[r.ID] {
			moving[r.ID] = del
			continue
		}
		g, err := newGroup(r.Node, kindDeregister, del)
		if err != nil {
			return nil, fmt.Errorf("deregister %s: %w", r.ID, err)
		}
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
		g, err := newGroup(u.Have.Node, kindUpdate, ops...)
		if err != nil {
			return nil, fmt.Errorf("update %s: %w", u.Want.ID, err)
		}
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
		kind, ops := kindRegister, []*api.TxnOp{c.serviceOp(node, in, 0), c.checkOp(node, in, 0)}
		if del, ok := moving[in.ID]; ok {
			kind, ops = kindMove, append([]*api.TxnOp{del}, ops...)
		}
		g, err := newGroup(node, kind, ops...)
		if err != nil {
			return nil, fmt.Errorf("register %s: %w", in.ID, err)
		}
		g.want = in
		regs = append(regs, g)
	}
	return append(append(regs, updates...), dels...), nil
}

// newGroup encodes ops once (wire.AppendOp): for the size limit, and as the
// request body (a cold start of 10,000 Services encoded every op twice
// before, 7 % of its CPU). An op that cannot be encoded is an error: the body must hold
// every op the group counts.
func newGroup(node string, kind int, ops ...*api.TxnOp) (group, error) {
	g := group{ops: ops, kind: kind, node: node}
	for _, op := range ops {
		if len(g.enc) > 0 {
			g.enc = append(g.enc, ',')
		}
		n := len(g.enc)
		var err error
		if g.enc, err = wire.AppendOp(g.enc, op); err != nil {
			return group{}, fmt.Errorf("encode a transaction op: %w", err)
		}
		g.bytes += len(g.enc) - n
	}
	return g, nil
}

func (c *Client) serviceOp(node string, in Instance, index uint64) *api.TxnOp {
	return &api.TxnOp{Service: &api.ServiceTxnOp{
		Verb: api.ServiceCAS,
		Node: node,
		Service: api.AgentService{
			ID: in.ID, Service: in.Name, Address: in.Address, Port: in.Port,
			Tags: in.Tags, Meta: in.Meta, ModifyIndex: index, Weights: weights(in.Weight),
			Namespace: c.opts.Scope.NamespaceOf(in), Partition: c.opts.Scope.Normal().Partition,
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
			Namespace:   c.opts.Scope.NamespaceOf(in), Partition: c.opts.Scope.Normal().Partition,
		},
	}}
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
