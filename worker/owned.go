package worker

import (
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
