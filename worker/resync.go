package worker

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/fleetsync/fleetsync/consul"
)

// Resync asks the worker for an anti-entropy pass: re-read its owned state
// from Consul and repair any drift. It never blocks. The supervisor calls it
// when Consul lost its data; the worker also runs one every ResyncPeriod.
func (w *Worker) Resync() {
	select {
	case w.resync <- struct{}{}:
	default:
	}
}

// firstResync spreads the fleet's passes: the first falls uniformly in
// (period/2, 3*period/2] after the worker's first flush (armResync), so
// 10,000 workers started together make 33 passes a second at 5m, as
// later (every period ±10%), and none in the first half period. That
// flush ended with the worker's state just read (the fleet's read of
// Consul) or just written, and a pass in the minutes after re-reads it:
// in a cold start of 10,000 Services such passes (then in (0, period]
// after the start) were 2,700 reads of names and crowded nodes that
// Consul served while it applied the fleet's writes. (A first pass in
// (period/2, period] instead would make the passes come at twice the
// rate for half of every period, for many periods: the ±10 % spreads
// them out slowly.)
func firstResync(period time.Duration) time.Duration {
	return period/2 + time.Duration(rand.Int64N(int64(period))) + 1
}

func nextResync(period time.Duration) time.Duration {
	return time.Duration(float64(period) * (0.9 + 0.2*rand.Float64()))
}

// readOwnedByName is the anti-entropy read: one request per Consul name the
// worker knows (the names of its owned instances and its desired name),
// each backed by Consul's service index. It reports false when it cannot be
// used (no names known).
func (w *Worker) readOwnedByName(ctx context.Context) (bool, error) {
	var names []string
	aside(func() { names = w.knownNames() })
	if len(names) == 0 {
		return false, nil
	}
	// Someone else's entry under one of our IDs with another Consul name
	// is not in these reads: read by ID prefix instead, or the pass would
	// forget it and try (and fail) to create that ID again.
	for _, f := range w.foreign {
		if !slices.Contains(names, f.Name) {
			return false, nil
		}
	}
	// The catalog's marks and the indexes of the nodes the entries are
	// on, read before the entries: a write landing in between then shows
	// as a moved index.
	v := &verification{names: make(map[string]uint64, len(names)), nodes: map[string]uint64{}}
	var err error
	// From a read begun after the last write of ours: marks read before
	// it would stand for a catalog without it.
	aside(func() { v.marks, err = w.opts.Store.CatalogMarks(ctx, w.lastWrite) })
	if err != nil {
		return true, fmt.Errorf("anti-entropy read: %w", err)
	}
	for _, node := range w.entryNodes() {
		var index uint64
		var err error
		aside(func() { index, err = w.opts.Store.NodeIndex(ctx, node) })
		if err != nil {
			return true, fmt.Errorf("anti-entropy read: %w", err)
		}
		v.nodes[node] = index
	}
	var entries []consul.Registered
	for _, name := range names {
		var got []consul.Registered
		var index uint64
		var err error
		aside(func() { got, index, err = w.opts.Store.ReadService(ctx, name) })
		if err != nil {
			return true, fmt.Errorf("anti-entropy read: %w", err)
		}
		entries = append(entries, got...)
		v.names[name] = index
	}
	w.owned = OwnedOf(w.opts.Config.Cluster, w.opts.Key, entries)
	w.foreign = ForeignOf(w.opts.Config.Cluster, w.opts.Key, entries)
	w.ownedKnown = true
	w.verified = v.complete(w.entryNodes())
	w.log.Trace("Read the owned state by name", "names", names, "owned", len(w.owned), "foreign", len(w.foreign))
	return true, nil
}

// verification is what a read by name found, for the periodic passes
// after it (see unchangedSince).
type verification struct {
	// marks are the catalog's, read before the names and nodes (or at a
	// later pass that found those unmoved): the same marks now mean the
	// whole catalog is as it was then.
	marks  consul.CatalogMarks
	names  map[string]uint64 // Consul name -> the index its read answered
	nodes  map[string]uint64 // node of an entry -> its index, read before
	passes int               // passes that read nothing since
}

// fullReadEvery bounds the passes that read nothing in a row: every 12th
// pass (an hour at the default period) reads every instance whatever the
// indexes say, for anything they cannot show.
const fullReadEvery = 12

// complete returns v if it covers every node in nodes and every index is
// known (Consul Enterprise's mirrored namespaces answer none), else nil.
func (v *verification) complete(nodes []string) *verification {
	for _, node := range nodes {
		if _, ok := v.nodes[node]; !ok {
			return nil
		}
	}
	for _, i := range v.names {
		if i == 0 {
			return nil
		}
	}
	return v
}

// entryNodes names the nodes of the owned and foreign entries, sorted.
func (w *Worker) entryNodes() []string {
	set := map[string]bool{}
	for _, r := range w.owned {
		set[r.Node] = true
	}
	for _, r := range w.foreign {
		set[r.Node] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// forceResync makes the next flush a full anti-entropy pass: a read
// whatever the indexes say (Consul lost data, or did not answer).
func (w *Worker) forceResync() {
	w.resyncDue, w.resyncTimed = true, false
}

// unchangedSince reports whether a periodic pass has nothing to read: the
// cache came from a read by name, nothing was written since, and either
// the catalog's marks are where they were when the read began (nothing in
// the whole catalog moved: no request of the worker's own, the marks'
// read being shared by the fleet), or every name the worker knows is
// still at the index that read answered and every node its entries are on
// at the index read just before it (then the marks read before these
// checks become the ones the next pass compares with).
// Consul raises a name's index with every write of a service or check of
// that name, and a node's with every write of a service on the node
// (including one of ours given another name, which leaves our name's
// index alone), by anyone (consul.TestServiceIndexMovesWithEveryWriteOfTheService,
// consul.TestNodeIndexMovesWithARename): equal indexes mean no entry of
// ours was edited, deleted, renamed or added to since. In a quiet catalog
// a pass costs nothing; after a write anywhere in it, each worker's next
// pass costs two requests that return no entry (one name, one node, for
// most Services) instead of a read of every instance. A name
// or node not verified, an index that moved, or fullReadEvery passes in a
// row mean a full read.
func (w *Worker) unchangedSince(ctx context.Context) (bool, error) {
	v := w.verified
	if !w.ownedKnown || v == nil || v.passes+1 >= fullReadEvery {
		return false, nil
	}
	var marks consul.CatalogMarks
	var err error
	aside(func() { marks, err = w.opts.Store.CatalogMarks(ctx, time.Time{}) })
	if err != nil {
		return false, fmt.Errorf("anti-entropy check: %w", err)
	}
	if marks.Known() && marks == v.marks {
		v.passes++ // nothing in the catalog moved: no request of our own
		return true, nil
	}
	names := map[string]bool{}
	for _, r := range w.owned {
		names[r.Name] = true
	}
	if w.desiredName != "" {
		names[w.desiredName] = true
	}
	for _, f := range w.foreign {
		names[f.Name] = true
	}
	if same, err := unmoved(ctx, v.names, slices.Collect(maps.Keys(names)), w.opts.Store.ServiceIndex); !same || err != nil {
		return false, err
	}
	if same, err := unmoved(ctx, v.nodes, w.entryNodes(), w.opts.Store.NodeIndex); !same || err != nil {
		return false, err
	}
	// Our names and nodes did not move since the read, up to after the
	// marks were read: what the read found was still there when they
	// were, so the next pass may compare with these.
	v.marks = marks
	v.passes++
	return true, nil
}

// unmoved reports whether index(k) is still was[k] for every k in keys (a
// key not in was: no).
func unmoved(ctx context.Context, was map[string]uint64, keys []string, index func(context.Context, string) (uint64, error)) (bool, error) {
	for _, k := range keys {
		want, ok := was[k]
		if !ok {
			return false, nil
		}
		var now uint64
		var err error
		aside(func() { now, err = index(ctx, k) })
		if err != nil {
			return false, fmt.Errorf("anti-entropy check: %w", err)
		}
		if now != want {
			return false, nil
		}
	}
	return true, nil
}

func (w *Worker) knownNames() []string {
	set := map[string]bool{}
	for _, r := range w.owned {
		set[r.Name] = true
	}
	if svc, selected := w.opts.Lookup(); svc != nil && selected {
		if spec, err := Desired(svc, w.opts.Config); err == nil {
			set[spec.Name] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}
