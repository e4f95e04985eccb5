package supervisor

import (
	"context"
	"fmt"
	"testing"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor/shard"
	"github.com/fleetsync/fleetsync/worker"
)

// TestGainAndLoseShards: only the services of held shards get workers;
// losing a shard stops its workers without deregistering anything; gaining
// it back writes nothing for services already right in Consul.
func TestGainAndLoseShards(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	// Two services in different shards of 2.
	var a, b k8s.Key
	for i := 0; a.Name == "" || b.Name == ""; i++ {
		k := k8s.Key{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}
		switch shard.Of(k, 2) {
		case 0:
			a = k
		case 1:
			b = k
		}
	}
	w.services[a] = service(a.Namespace, a.Name, "10.0.0.1")
	w.services[b] = service(b.Namespace, b.Name, "10.0.0.2")
	close(w.synced)
	f, ctx := startSharded(t, w, store, "test", 2)
	sup, cluster := f.sup, f.cluster
	if sup.Len() != 0 {
		t.Fatalf("%d workers with no shard held", sup.Len())
	}
	sup.GainShard(ctx, 0)
	f.waitFor(t, "a synced", func() bool { return store.count(cluster.IDPrefix(a.Namespace, a.Name)) == 1 })
	if sup.Len() != 1 || store.count(cluster.IDPrefix(b.Namespace, b.Name)) != 0 {
		t.Fatalf("shard 1's service synced without its shard")
	}
	sup.LoseShard(0)
	if sup.Len() != 0 {
		t.Fatalf("%d workers after losing the only shard", sup.Len())
	}
	if store.count("") != 1 {
		t.Fatal("losing a shard deregistered its instances")
	}
	applies := store.appliesN()
	sup.GainShard(ctx, 0)
	sup.GainShard(ctx, 1)
	f.waitFor(t, "b synced", func() bool { return store.count(cluster.IDPrefix(b.Namespace, b.Name)) == 1 })
	f.waitFor(t, "two workers", func() bool { return sup.Len() == 2 })
	if got := store.appliesN() - applies; got != 1 {
		t.Errorf("%d writes after regaining shard 0 and gaining shard 1, want 1 (b only)", got)
	}
	if got := sup.HeldShards(); len(got) != 2 {
		t.Errorf("held = %v", got)
	}
}

func (m *memStore) appliesN() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.applies
}

// startSharded runs a supervisor of cluster over w (already synced) and
// store, holding none of its shards, until the test ends; it returns once
// the supervisor has bootstrapped.
func startSharded(t *testing.T, w *fakeWatcher, store *memStore, cluster string, shards int) (*fixture, context.Context) {
	t.Helper()
	c, err := ownership.New(cluster)
	if err != nil {
		t.Fatal(err)
	}
	sup := New(Options{Selector: Selector{Allow: []string{"*"}},
		Worker:  worker.Config{Cluster: c, Terminating: worker.TerminatingWarning},
		Watcher: w, Store: store, Shards: shards, DrainTimeout: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	f := &fixture{w: w, store: store, sup: sup, cluster: c}
	f.waitFor(t, "bootstrap", sup.Bootstrapped)
	return f, ctx
}
