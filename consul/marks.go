package consul

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"
)

// CatalogMarks are two of Consul's catalog-wide indexes. Together they move
// with every write in the catalog, by anyone: Nodes with every write or
// delete of a node or of a service on any node, Checks with every write or
// delete of a check (Consul's state store: catalogUpdateNodesIndexes,
// catalogUpdateCheckIndexes; pinned on a real agent by
// TestCatalogMarksMoveWithEveryCatalogWrite). Equal marks read at two times
// mean that nothing in the catalog changed in between, so an anti-entropy
// pass over a quiet catalog needs no request of its own.
type CatalogMarks struct {
	Nodes  uint64
	Checks uint64
}

// Known reports whether both indexes were read (Consul Enterprise scopes
// answer none: what they cover there is not pinned by a test here).
func (m CatalogMarks) Known() bool { return m.Nodes != 0 && m.Checks != 0 }

// MarksMaxAge is how old the marks CatalogMarks returns may be by default
// (Options.MarksMaxAge): the fleet's passes share one read of them per
// second, so a change made within that second before a pass is seen by the
// next pass instead.
const MarksMaxAge = time.Second

// marksProbe names what the marks' reads ask for: a node meta value and a
// node that nothing has, so Consul answers only the index.
const marksProbe = "fleetsync-index-probe"

// marksCache is the one shared read of the marks.
type marksCache struct {
	slot  chan struct{} // held by the reader of the moment (size 1)
	at    time.Time     // when the cached read began
	marks CatalogMarks
}

// CatalogMarks returns the catalog's marks from a read that began at or
// after after, and at most Options.MarksMaxAge ago. Callers at the same
// time share one read: two requests that return no entry. Marks that are
// to stand for what was read or written at some time must come from a read
// begun after it: marks read before a write of ours would come back
// exactly with a restore of a snapshot taken before that write.
func (c *Client) CatalogMarks(ctx context.Context, after time.Time) (CatalogMarks, error) {
	if c.opts.Scope.Normal().Enterprise() {
		return CatalogMarks{}, nil
	}
	select {
	case c.marks.slot <- struct{}{}:
	case <-ctx.Done():
		return CatalogMarks{}, ctx.Err()
	}
	defer func() { <-c.marks.slot }()
	if !c.marks.at.IsZero() && c.now().Sub(c.marks.at) <= c.opts.MarksMaxAge && !c.marks.at.Before(after) {
		return c.marks.marks, nil
	}
	at := c.now()
	m, err := c.readMarks(ctx)
	if err != nil {
		return CatalogMarks{}, err
	}
	c.marks.at, c.marks.marks = at, m
	return m, nil
}

func (c *Client) readMarks(ctx context.Context) (CatalogMarks, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return CatalogMarks{}, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	var m CatalogMarks
	q := c.opts.Scope.nodeQuery(&api.QueryOptions{NodeMeta: map[string]string{marksProbe: "none"}}).WithContext(rctx)
	_, meta, err := c.api.CatalogNodes(q)
	if err != nil {
		return CatalogMarks{}, fmt.Errorf("read the catalog's nodes index: %w", c.ctxErr(ctx, err))
	}
	if meta != nil {
		m.Nodes = meta.LastIndex
	}
	q = c.opts.Scope.instanceQuery(&api.QueryOptions{Filter: `CheckID == "" and CheckID != ""`}).WithContext(rctx)
	_, meta, err = c.api.NodeChecks(marksProbe, q)
	if err != nil {
		return CatalogMarks{}, fmt.Errorf("read the catalog's checks index: %w", c.ctxErr(ctx, err))
	}
	if meta != nil {
		m.Checks = meta.LastIndex
	}
	return m, nil
}
