package consul

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// Witness is one committed service write: the entry must be in Consul at
// exactly that index (a later write of ours retires the witness before it
// is sent) unless Consul lost or rolled it back, or someone else rewrote
// it. With Deleted, it is our committed delete of the entry: the entry
// must not be in Consul at all.
//
// Only exact equality holds after two faults: Consul that lost its last
// writes reuses their indexes, so a restore of a snapshot taken before the
// loss brings entries back at indexes above those written since (found by
// the soak: a kill -9 of every server, then such a restore).
type Witness struct {
	Node, ID, Name string
	Index          uint64 // 0 with Deleted
	Deleted        bool
	At             time.Time // when it was committed
}

// Witnesses are kept one per witnessEvery at most, for witnessFor.
const (
	witnessEvery = 500 * time.Millisecond
	witnessFor   = 5 * time.Minute
)

// witnessed records a committed write of an entry, or our own delete of
// it (Deleted): it replaces the entry's earlier witness. About one write
// per witnessEvery is kept, and the newest, for witnessFor: a restore of a
// snapshot of any age up to that undoes at least one of them, and so does
// a crash that loses the last writes.
func (r *nodeRegistry) witnessed(w Witness) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.witnesses = slices.DeleteFunc(r.witnesses, func(o Witness) bool { return o.ID == w.ID || w.At.Sub(o.At) > witnessFor })
	// The newest write is always a witness (a crash loses the last writes
	// first); it replaces the newest one kept when both fall within
	// witnessEvery of the one before.
	if n := len(r.witnesses); n > 1 && w.At.Sub(r.witnesses[n-2].At) < witnessEvery {
		r.witnesses[n-1] = w
		return
	}
	r.witnesses = append(r.witnesses, w)
}

// unwitness retires the witness of entry id, if any: before a write of
// the entry is sent (the entry is then at an index the witness does not
// know, or gone, before the answer comes back), and for good when the
// write gets no answer (it may or may not have committed).
func (r *nodeRegistry) unwitness(id string) {
	if id == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.witnesses = slices.DeleteFunc(r.witnesses, func(o Witness) bool { return o.ID == id })
}

// ForgetWitnesses retires the witnesses of the entries whose ID starts
// with prefix: a Service this process no longer syncs (another replica
// took it over, or it is gone) may be rewritten or deleted by others.
func (c *Client) ForgetWitnesses(prefix string) {
	c.nodes.mu.Lock()
	defer c.nodes.mu.Unlock()
	c.nodes.witnesses = slices.DeleteFunc(c.nodes.witnesses, func(o Witness) bool { return strings.HasPrefix(o.ID, prefix) })
}

// Witnesses returns the standing witnesses, oldest first (none since the
// start or the last ResetCommitted).
func (c *Client) Witnesses() []Witness {
	c.nodes.mu.Lock()
	defer c.nodes.mu.Unlock()
	return slices.Clone(c.nodes.witnesses)
}

// IsWitness reports whether w is still a standing witness (no write or
// delete of ours since, sent or committed, replaced it).
func (c *Client) IsWitness(w Witness) bool {
	c.nodes.mu.Lock()
	defer c.nodes.mu.Unlock()
	return slices.Contains(c.nodes.witnesses, w)
}

// WitnessRead is what ReadWitness found of a witness's entry.
type WitnessRead struct {
	Found bool
	Index uint64 // the entry's service index, when found
	// Ours: the entry found carries the owner's mark (Owner.Owns). Someone
	// else's entry under the ID (a tamperer's, say) is not a loss: the
	// worker's next read finds it and leaves it alone.
	Ours bool
}

// ReadWitness reads w's entry (one small request).
func (c *Client) ReadWitness(ctx context.Context, w Witness) (WitnessRead, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return WitnessRead{}, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	q := c.opts.Scope.instanceQuery(&api.QueryOptions{Filter: fmt.Sprintf("Service.ID == %q and Node.Node == %q", w.ID, w.Node)}).WithContext(rctx)
	entries, _, err := c.api.ServiceEntries(w.Name, q)
	if err != nil {
		return WitnessRead{}, fmt.Errorf("read entry %s on %s: %w", w.ID, w.Node, c.ctxErr(ctx, err))
	}
	for _, e := range entries {
		if e.Service != nil && e.Node != nil && e.Service.ID == w.ID && e.Node.Node == w.Node {
			ours := c.owner.Owns(fromWire(e.Node.Node, e.Service, nil)) == nil
			return WitnessRead{Found: true, Index: e.Service.ModifyIndex, Ours: ours}, nil
		}
	}
	return WitnessRead{}, nil
}
