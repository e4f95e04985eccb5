package shard

import (
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// TestFencedShardIsHandedOver: Fenced(0) hands shard 0 over at the next
// reconcile: the fleet loses it, its Lease is released, and, free again,
// it is run for and gained anew (the fleet takes a new fence then); shard
// 1 stays.
func TestFencedShardIsHandedOver(t *testing.T) {
	client := fake.NewClientset()
	conditionalUpdates(client)
	var mu sync.Mutex
	released := 0
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if l.Name == "fleetsync-c-shard-0" && ptr.Deref(l.Spec.HolderIdentity, "") == "" {
			mu.Lock()
			released++
			mu.Unlock()
		}
		return false, nil, nil
	})
	f, _ := newFleet(t)
	m, err := New(testConfig(2), Deps{Client: client, ClusterID: "c", Fleet: f})
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, m)
	f.waitFor(t, "both shards led", func() bool { return len(f.HeldShards()) == 2 })
	f.mu.Lock()
	gained := f.gained
	f.mu.Unlock()

	m.Fenced(0)
	waitFor(t, "shard 0's Lease released", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return released == 1
	})
	f.waitFor(t, "shard 0 gained again", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.gained == gained+1 && f.held[0] && f.held[1]
	})
}
