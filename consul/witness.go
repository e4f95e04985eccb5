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
// that index, or a later one (someone's later write; a write of ours
// retires the witness before it is sent), unless Consul lost or rolled it
// back; so must its readiness check at CheckIndex (a change of readiness
// alone rewrites only the check, which moves no node index). With
// Deleted, it is our committed delete of the entry, which committed at
// Index or later: the entry must not be back at a lower index. The loss
// check holds witnesses at indexes Consul may have handed out twice to
// exactly their index (supervisor's checkWitness).
type Witness struct {
	Node, ID, Name string
	Index          uint64
	CheckIndex     uint64 // 0: not known (the check is not compared)
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
	// Oldest first, always: two answers taken at once may come in either
	// order (the loss check searches the witnesses by time).
	if n := len(r.witnesses); n > 0 && w.At.Before(r.witnesses[n-1].At) {
		w.At = r.witnesses[n-1].At
	}
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

// retire retires the witnesses of the entries ids before a write of them
// is sent (the entries are then at indexes the witnesses do not know, or
// gone, before the answer comes back) and returns them: for good when the
// write gets no answer (it may or may not have committed), reinstated
// when Consul refused it (nothing committed).
func (r *nodeRegistry) retire(ids []string) []Witness {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Witness
	r.witnesses = slices.DeleteFunc(r.witnesses, func(o Witness) bool {
		if slices.Contains(ids, o.ID) {
			out = append(out, o)
			return true
		}
		return false
	})
	return out
}

// reinstate puts retired witnesses back in their place (oldest first),
// each unless a newer one of its entry stands.
func (r *nodeRegistry) reinstate(ws []Witness) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		if slices.ContainsFunc(r.witnesses, func(o Witness) bool { return o.ID == w.ID }) {
			continue
		}
		i, _ := slices.BinarySearchFunc(r.witnesses, w, func(a, b Witness) int { return a.At.Compare(b.At) })
		r.witnesses = slices.Insert(r.witnesses, i, w)
	}
}

// ForgetWitnesses retires the witnesses of the entries whose ID starts
// with prefix: a Service another replica took over may be rewritten or
// deleted by it. (A Service that is gone keeps its deletes as witnesses.)
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
	Found      bool
	Index      uint64 // the entry's service index, when found
	CheckIndex uint64 // its readiness check's index; 0: no check
	// Ours: the entry found carries the owner's mark (Owner.Owns). Someone
	// else's entry under the ID (a tamperer's, say) is not a loss: the
	// worker's next read finds it and leaves it alone.
	Ours bool
}

// ReadWitness reads w's entry (one small consistent request).
func (c *Client) ReadWitness(ctx context.Context, w Witness) (WitnessRead, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return WitnessRead{}, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	// Consistent: a leader elected a moment ago answers a default read
	// before it has applied the log, which would show a write just before
	// the outage as undone (its witnesses are checked right then).
	q := c.opts.Scope.instanceQuery(&api.QueryOptions{RequireConsistent: true, Filter: fmt.Sprintf("Service.ID == %q and Node.Node == %q", w.ID, w.Node)}).WithContext(rctx)
	entries, _, err := c.api.ServiceEntries(w.Name, q)
	if err != nil {
		return WitnessRead{}, fmt.Errorf("read entry %s on %s: %w", w.ID, w.Node, c.ctxErr(ctx, err))
	}
	for _, e := range entries {
		if e.Service != nil && e.Node != nil && e.Service.ID == w.ID && e.Node.Node == w.Node {
			ours := c.owner.Owns(fromWire(e.Node.Node, e.Service, nil)) == nil
			r := WitnessRead{Found: true, Index: e.Service.ModifyIndex, Ours: ours}
			for _, hc := range e.Checks {
				if hc.CheckID == CheckID(w.ID) && hc.ServiceID == w.ID {
					r.CheckIndex = hc.ModifyIndex
				}
			}
			return r, nil
		}
	}
	return WitnessRead{}, nil
}
