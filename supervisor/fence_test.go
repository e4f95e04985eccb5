package supervisor

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/fence"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/shard"
)

// TestFencedShardStopsItsWorkers: this replica holds shards 0 and 1 under
// their fences; another replica takes shard 0's fence. The next write of a
// shard-0 Service is refused: shard 0 is lost here (every one of its
// workers stopped, Fencing.Fenced told once), its refused change never
// lands, and shard 1 goes on.
func TestFencedShardStopsItsWorkers(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	var zero []k8s.Key
	var one k8s.Key
	for i := 0; len(zero) < 2 || one.Name == ""; i++ {
		k := k8s.Key{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}
		if shard.Of(k, 2) == 0 && len(zero) < 2 {
			zero = append(zero, k)
		} else if shard.Of(k, 2) == 1 && one.Name == "" {
			one = k
		}
	}
	for i, k := range append(slices.Clone(zero), one) {
		w.services[k] = service(k.Namespace, k.Name, fmt.Sprintf("10.0.0.%d", i+1))
	}
	close(w.synced)
	mine := fence.New(store.twin.Client(), fence.Options{ClusterID: "test", Holder: "me"})
	fencedC := make(chan int, 10)
	f := startOptions(t, w, store, func(o *Options) {
		o.Shards = 2
		o.Fencing = Fencing{
			Take: func(ctx context.Context, k int) (consul.Guard, error) {
				tok, err := mine.Take(ctx, k)
				if err != nil {
					return nil, err
				}
				return tok, nil
			},
			Fenced: func(k int) { fencedC <- k },
		}
	}, nil)
	sup := f.sup
	f.waitFor(t, "bootstrap", sup.Bootstrapped)
	ctx := t.Context()
	sup.GainShard(ctx, 0)
	sup.GainShard(ctx, 1)
	f.waitFor(t, "3 services synced", func() bool { return store.count("") == 3 })

	theirs := fence.New(store.twin.Client(), fence.Options{ClusterID: "test", Holder: "other"})
	if _, err := theirs.Take(ctx, 0); err != nil {
		t.Fatal(err)
	}
	a := zero[0]
	w.set(a, service(a.Namespace, a.Name, "10.0.0.1", "10.0.0.9"))
	select {
	case k := <-fencedC:
		if k != 0 {
			t.Fatalf("Fenced(%d), want shard 0", k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Fencing.Fenced not told")
	}
	f.waitFor(t, "shard 0 lost", func() bool { return slices.Equal(sup.HeldShards(), []int{1}) && sup.Len() == 1 })
	if got := store.count(f.cluster.IDPrefix(a.Namespace, a.Name)); got != 1 {
		t.Errorf("%d instances of %s, want 1: the refused registration landed", got, a.Name)
	}
	if store.count("") != 3 {
		t.Errorf("%d instances, want the 3 written before: losing the shard deregistered", store.count(""))
	}
	select {
	case k := <-fencedC:
		t.Errorf("Fenced(%d) told again", k)
	default:
	}
	// Shard 1 goes on.
	w.set(one, service(one.Namespace, one.Name, "10.0.0.3", "10.0.0.8"))
	f.waitFor(t, "shard 1 still synced", func() bool { return store.count(f.cluster.IDPrefix(one.Namespace, one.Name)) == 2 })
}

// TestGainShardEndedWhileTakingTheFence: leading ends (its context is
// cancelled, and LoseShard runs) while GainShard takes the fence: the
// shard is not marked held afterwards, so no worker of it starts.
func TestGainShardEndedWhileTakingTheFence(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	close(w.synced)
	mine := fence.New(store.twin.Client(), fence.Options{ClusterID: "test", Holder: "me"})
	gctx, cancel := context.WithCancel(t.Context())
	var sup *Supervisor
	f := startOptions(t, w, store, func(o *Options) {
		o.Shards = 2
		o.Fencing = Fencing{Take: func(ctx context.Context, k int) (consul.Guard, error) {
			tok, err := mine.Take(ctx, k)
			cancel() // leading ends as the fence is taken
			sup.LoseShard(k)
			if err != nil {
				return nil, err
			}
			return tok, nil
		}}
	}, nil)
	sup = f.sup
	f.waitFor(t, "bootstrap", sup.Bootstrapped)
	sup.GainShard(gctx, 0)
	if got := sup.HeldShards(); len(got) != 0 {
		t.Fatalf("holds %v after leading ended while the fence was taken", got)
	}
}
