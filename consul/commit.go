package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// commitGroups sends one transaction: the guard's ops, the fence's (when
// fence is set), the node ops, then the groups' ops. A failed guard is
// re-checked once (the claim may only have changed hands between this
// cluster's own replicas) before it is returned. A failed fence is
// re-checked too: when another replica took the shard, the refusal is
// returned as a *TxnError matching ErrFenced and nothing is sent again.
func (c *Client) commitGroups(ctx context.Context, groups []group, nodes []string, fence Guard) (*wire.TxnResponse, error) {
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
		gops, err := guardOps(guard)
		if err != nil {
			return nil, err
		}
		fops, err := guardOps(fence)
		if err != nil {
			return nil, err
		}
		ops, guarded, fenced := slices.Concat(gops, fops), len(gops), len(fops)
		nodeOps, created, err := c.nodeOps(ctx, nodes)
		if err != nil {
			return nil, err
		}
		ops = append(ops, nodeOps...)
		body, err := txnBody(ops, groups)
		if err != nil {
			return nil, err
		}
		for _, g := range groups {
			ops = append(ops, g.ops...)
		}
		resp, err := c.commit(ctx, ops, body)
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
		te.locate(ops, guarded, fenced, len(nodeOps), groups)
		if len(te.Nodes) > 0 {
			c.nodes.forget() // re-read before the next node op
		}
		if te.Guard {
			if gerr := guard.Failed(ctx); gerr != nil {
				return nil, gerr
			}
		}
		if te.Fence {
			if ferr := fence.Failed(ctx); ferr != nil {
				if !errors.Is(ferr, ErrFenced) {
					return nil, ferr // not known: the next try sends the same fence
				}
				te.Fenced = ferr.Error()
				return nil, te // never sent again: the shard is another replica's
			}
		}
		if (te.Guard || te.Fence) && attempt == 0 {
			continue
		}
		return nil, te
	}
}

// guardOps are g's ops for one transaction (none without a guard), at most
// MaxGuardOps of them.
func guardOps(g Guard) (api.TxnOps, error) {
	if g == nil {
		return nil, nil
	}
	ops, err := g.Ops()
	if err != nil {
		return nil, err
	}
	if len(ops) > MaxGuardOps {
		return nil, fmt.Errorf("a guard gives %d ops, more than the %d kept for it", len(ops), MaxGuardOps)
	}
	return ops, nil
}

// txnBody is the JSON of a transaction of first followed by the ops of
// groups, byte for byte what encoding/json makes of the whole list (and
// consul/api sends), from the groups' own encoding (newGroup).
func txnBody(first api.TxnOps, groups []group) ([]byte, error) {
	n := 3
	for _, g := range groups {
		n += len(g.enc) + 1
	}
	body := make([]byte, 0, n+512*len(first))
	body = append(body, '[')
	for _, op := range first {
		b, err := json.Marshal(op)
		if err != nil {
			return nil, fmt.Errorf("encode a transaction op: %w", err)
		}
		if len(body) > 1 {
			body = append(body, ',')
		}
		body = append(body, b...)
	}
	for _, g := range groups {
		if len(body) > 1 {
			body = append(body, ',')
		}
		body = append(body, g.enc...)
	}
	return append(body, ']', '\n'), nil
}

// commit sends ops as one transaction; body is their JSON (txnBody).
func (c *Client) commit(ctx context.Context, ops api.TxnOps, body []byte) (*wire.TxnResponse, error) {
	start := time.Now()
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	ok, resp, err := c.api.CommitTxn(ops, body, c.opts.Scope.nodeQuery(&api.QueryOptions{}).WithContext(rctx))
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
func (c *Client) recordNodes(resp *wire.TxnResponse) {
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
func (c *Client) collect(groups []group, resp *wire.TxnResponse, done *Applied) {
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
	now := c.now()
	// Our deletes committed after every index this answer or an earlier
	// one returned: a deleted entry back at a lower index is from before
	// the delete (Witness.Index of a delete).
	after := c.nodes.highest()
	if resp != nil {
		for _, r := range resp.Results {
			switch {
			case r.Node != nil:
				after = max(after, r.Node.ModifyIndex)
			case r.Service != nil:
				after = max(after, r.Service.ModifyIndex)
			case r.Check != nil:
				after = max(after, r.Check.ModifyIndex)
			}
		}
	}
	for _, g := range groups {
		if g.kind != kindDeregister {
			c.nodes.sawIndex(g.node, svcIndex[g.want.ID]) // checks do not raise the node index
		}
		if g.kind == kindDeregister {
			done.Deleted = append(done.Deleted, g.have.ID)
			// The delete committed above every index seen so far and
			// above the entry's own: an entry back at any of them is
			// from before it. (after alone may be the entry's own index,
			// when it was our latest write: the node op of a delete
			// changes nothing and returns the node's old index.)
			at := max(after, g.have.ServiceIndex, g.have.CheckIndex) + 1
			c.nodes.witnessed(Witness{Node: g.have.Node, ID: g.have.ID, Name: g.have.Name, Index: at, Deleted: true, At: now})
			continue
		}
		if i := svcIndex[g.want.ID]; i > 0 {
			// The check as this write left it: rewritten by it, or as
			// read (an update that changes only the service sends no
			// check op).
			ci, ok := checkIndex[CheckID(g.want.ID)]
			if !ok && g.have != nil && g.have.HasCheck {
				ci = g.have.CheckIndex
			}
			c.nodes.witnessed(Witness{Node: g.node, ID: g.want.ID, Name: g.want.Name, Index: i, CheckIndex: ci, At: now})
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
