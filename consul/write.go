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

const (
	kindRegister = iota
	kindUpdate
	kindDeregister
	kindMove // deregistered and registered again under the same ID (renamed or on another node)
)

// Apply writes ch as few transactions as the limits allow, deletes first.
// It returns what was committed even when a later transaction fails; the
// error matches ErrConflict when a CAS failed, ErrRefused when ownership
// refused an input (then nothing at all is sent).
func (c *Client) Apply(ctx context.Context, ch Change) (Applied, error) {
	permit := ch.Permit
	defer func() { permit.Release() }()
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
		// One node op per node the transaction touches, before its
		// service ops (Consul needs the node to exist).
		n, bytes := 0, 0
		var nodes, ops api.TxnOps
		inTxn := map[string]bool{}
		for n < len(groups) {
			g := groups[n]
			extra := 0
			if !inTxn[g.node] {
				extra = 1
			}
			if len(nodes)+len(ops)+extra+len(g.ops) > c.opts.MaxOps || (n > 0 && bytes+g.bytes > c.opts.MaxBytes) {
				break
			}
			if extra == 1 {
				inTxn[g.node] = true
				nodes = append(nodes, c.nodeOp(g.node))
			}
			ops = append(ops, g.ops...)
			bytes += g.bytes
			n++
		}
		ops = append(nodes, ops...)
		resp, err := c.commit(ctx, ops)
		if err != nil {
			return done, err
		}
		done.Txns++
		done.Ops += len(ops)
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

func (c *Client) plan(ch Change) ([]group, error) {
	groups := make([]group, 0, ch.Len())
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
			Service: api.AgentService{ID: r.ID, Service: r.Name, ModifyIndex: r.ServiceIndex},
		}}
		if registering[r.ID] {
			moving[r.ID] = del
			continue
		}
		g := newGroup(r.Node, kindDeregister, del)
		g.have = &r
		groups = append(groups, g)
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
		var ops []*api.TxnOp
		if !u.Want.SameService(u.Have.Instance) {
			ops = append(ops, c.serviceOp(u.Have.Node, u.Want, u.Have.ServiceIndex))
		}
		if u.Want.Check != u.Have.Check || !u.Have.HasCheck || u.Want.Name != u.Have.Name {
			ops = append(ops, c.checkOp(u.Have.Node, u.Want, u.Have.CheckIndex))
		}
		g := newGroup(u.Have.Node, kindUpdate, ops...)
		g.want, g.have = u.Want, &u.Have
		groups = append(groups, g)
	}
	for _, in := range ch.Register {
		if err := c.owner.Stamped(in); err != nil {
			return nil, fmt.Errorf("%w: register %s: %w", ErrRefused, in.ID, err)
		}
		node := c.owner.NodeNameFor(in.ID)
		g := newGroup(node, kindRegister, c.serviceOp(node, in, 0), c.checkOp(node, in, 0))
		if del, ok := moving[in.ID]; ok {
			g = newGroup(node, kindMove, del, c.serviceOp(node, in, 0), c.checkOp(node, in, 0))
		}
		g.want = in
		groups = append(groups, g)
	}
	return groups, nil
}

func newGroup(node string, kind int, ops ...*api.TxnOp) group {
	g := group{ops: ops, kind: kind, node: node}
	for _, op := range ops {
		b, _ := json.Marshal(op)
		g.bytes += len(b)
	}
	return g
}

func (c *Client) nodeOp(name string) *api.TxnOp {
	n := c.owner.NodeNamed(name)
	return &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet, Node: api.Node{
		Node: n.Name, Address: n.Address, Meta: n.Meta,
	}}}
}

func (c *Client) serviceOp(node string, in Instance, index uint64) *api.TxnOp {
	return &api.TxnOp{Service: &api.ServiceTxnOp{
		Verb: api.ServiceCAS,
		Node: node,
		Service: api.AgentService{
			ID: in.ID, Service: in.Name, Address: in.Address, Port: in.Port,
			Tags: in.Tags, Meta: in.Meta, ModifyIndex: index,
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
		},
	}}
}

func (c *Client) commit(ctx context.Context, ops api.TxnOps) (*api.TxnResponse, error) {
	start := time.Now()
	ok, resp, _, err := c.api.Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
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
		return nil, fmt.Errorf("consul transaction of %d ops: %w", len(ops), err)
	}
	return resp, nil
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
	for _, g := range groups {
		if g.kind == kindDeregister {
			done.Deleted = append(done.Deleted, g.have.ID)
			continue
		}
		r := Registered{Instance: g.want, Node: g.node, HasCheck: true}
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

func txnError(resp *api.TxnResponse) error {
	if resp == nil || len(resp.Errors) == 0 {
		return errors.New("transaction rolled back without errors")
	}
	msgs := make([]string, 0, len(resp.Errors))
	conflict := false
	for _, e := range resp.Errors {
		msgs = append(msgs, fmt.Sprintf("op %d: %s", e.OpIndex, e.What))
		if isCASFailure(e.What) {
			conflict = true
		}
	}
	msg := strings.Join(msgs, "; ")
	if conflict {
		return fmt.Errorf("%w: %s", ErrConflict, msg)
	}
	return fmt.Errorf("transaction rolled back: %s", msg)
}

func isCASFailure(what string) bool {
	w := strings.ToLower(what)
	return strings.Contains(w, "cas") || strings.Contains(w, "index is stale") ||
		strings.Contains(w, "does not exist") || strings.Contains(w, "already exists")
}
