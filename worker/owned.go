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

// GroupOwned splits a bulk read of our node into owned entries per Service.
// Entries that are not ours, or that name no Service, are counted in skipped
// and never touched.
func GroupOwned(cluster ownership.Cluster, entries []consul.Registered) (byKey map[k8s.Key][]consul.Registered, skipped int) {
	byKey = make(map[k8s.Key][]consul.Registered)
	for _, r := range entries {
		ns, name := r.Meta[MetaNamespace], r.Meta[MetaService]
		if cluster.Owns(r) != nil || ns == "" || name == "" {
			skipped++
			continue
		}
		k := k8s.Key{Namespace: ns, Name: name}
		byKey[k] = append(byKey[k], r)
	}
	return byKey, skipped
}
