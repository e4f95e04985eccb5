package worker

import (
	"context"
	"fmt"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
)

// OwnedOf keeps the entries that cluster owns and that belong to Service
// key (by their k8s-namespace and k8s-service meta), keyed by ID, as Held.
func OwnedOf(cluster ownership.Cluster, key k8s.Key, entries []consul.Registered) map[string]Held {
	out := make(map[string]Held)
	for _, r := range entries {
		if cluster.Owns(r) != nil {
			continue
		}
		if r.Meta[MetaNamespace] == key.Namespace && r.Meta[MetaService] == key.Name {
			out[r.ID] = Hold(r)
		}
	}
	return out
}

// HoldOwned splits a bulk read of our nodes into each Service's owned
// entries, held as its worker keeps them (Hold): a worker takes its map as
// it is. Entries that are not ours, or that name no Service, are counted
// in skipped and never touched.
//
// Nothing of the read stays reachable from the maps: at 10,000 Services x
// 10 a restart reads 100,000 entries (~200 bytes each, and their decoded
// meta maps), which are garbage once this returns instead of once the last
// worker is built from them.
func HoldOwned(cluster ownership.Cluster, entries []consul.Registered) (byKey map[k8s.Key]map[string]Held, skipped int) {
	keyOf := func(r *consul.Registered) (k8s.Key, bool) {
		ns, name := r.Meta[MetaNamespace], r.Meta[MetaService]
		if ns == "" || name == "" || cluster.Owns(*r) != nil {
			return k8s.Key{}, false
		}
		return k8s.Key{Namespace: ns, Name: name}, true
	}
	// Sized first: ten entries grown one by one rehash a map twice. The
	// keys are kept for the second pass (the zero Key: not ours).
	keys := make([]k8s.Key, len(entries))
	counts := make(map[k8s.Key]int)
	for i := range entries {
		if k, ok := keyOf(&entries[i]); ok {
			keys[i] = k
			counts[k]++
		} else {
			skipped++
		}
	}
	byKey = make(map[k8s.Key]map[string]Held, len(counts))
	for k, n := range counts {
		byKey[k] = make(map[string]Held, n)
	}
	for i, k := range keys {
		if k != (k8s.Key{}) {
			byKey[k][entries[i].ID] = Hold(entries[i])
		}
	}
	return byKey, skipped
}

func (w *Worker) readOwned(ctx context.Context) error {
	c := w.opts.Config.Cluster
	var entries []consul.Registered
	var err error
	aside(func() { entries, err = w.opts.Store.ReadPrefix(ctx, c.IDPrefix(w.opts.Key.Namespace, w.opts.Key.Name)) })
	if err != nil {
		return fmt.Errorf("read owned state: %w", err)
	}
	w.verified = nil // a read by node: no name's index
	w.owned = OwnedOf(c, w.opts.Key, entries)
	w.foreign = ForeignOf(c, w.opts.Key, entries)
	w.ownedKnown = true
	w.log.Trace("Read the owned state by ID prefix", "owned", len(w.owned), "foreign", len(w.foreign))
	return nil
}

// lossEvidence compares the entries a worker held with a fresh read: an
// entry now older than written, or gone, was lost by Consul (or deleted by
// someone: either way every worker should look). "" when there is none.
func lossEvidence(held, now map[string]Held, foreign map[string]consul.Registered) string {
	older, gone := 0, 0
	example := ""
	for id, h := range held {
		if _, taken := foreign[id]; taken {
			continue // re-registered by someone else: not a loss
		}
		n, ok := now[id]
		switch {
		case !ok:
			gone++
			if example == "" {
				example = fmt.Sprintf("%s (written at index %d) is gone", id, h.ServiceIndex)
			}
		case n.ServiceIndex < h.ServiceIndex:
			older++
			example = fmt.Sprintf("%s was written at index %d and is at index %d", id, h.ServiceIndex, n.ServiceIndex)
		}
	}
	if older == 0 && gone == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d entries older than written, %d gone; e.g. %s", older, len(held), gone, example)
}

func (w *Worker) merge(a consul.Applied) {
	for _, id := range a.Deleted {
		delete(w.owned, id)
	}
	for _, r := range a.Written {
		w.owned[r.ID] = Hold(r)
	}
}
