package shard

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
)

// runManager runs m.Run until the test ends. wait waits up to 10 s for
// Run's result (ok false: still running).
func runManager(t *testing.T, m *Manager) (wait func() (err error, ok bool), cancel context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	var result error
	var returned bool
	wait = func() (error, bool) {
		once.Do(func() {
			select {
			case result = <-done:
				returned = true
			case <-time.After(10 * time.Second):
			}
		})
		return result, returned
	}
	t.Cleanup(func() {
		cancel()
		if _, ok := wait(); !ok {
			t.Error("Run did not return after its context ended")
		}
	})
	return wait, cancel
}

func replicaRenewTime(t *testing.T, ctx context.Context, c *fake.Clientset) (time.Time, bool) {
	t.Helper()
	l, err := c.CoordinationV1().Leases("leases").Get(ctx, "fleetsync-c-replica-me", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return time.Time{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return l.Spec.RenewTime.Time, true
}

// TestRunUnderAFakeClock: Run waits for the fleet's bootstrap (not ready,
// nothing written), then writes its replica Lease and runs for the free
// shard; every retry period (on the injected clock) it renews its replica
// Lease; and one lease duration after the dead holder's Lease was first
// seen, by that clock alone, it takes the other shard over. On the way out
// it deletes its replica Lease and releases both shards.
func TestRunUnderAFakeClock(t *testing.T) {
	clock := newClock()
	t0 := clock.Now()
	client := fake.NewClientset(shardLease("fleetsync-c-shard-0", "dead", t0.Add(time.Hour)))
	conditionalUpdates(client)
	f := &fakeFleet{bootstrap: make(chan struct{}), held: map[int]bool{}}
	m, err := New(testConfig(2), Deps{Client: client, ClusterID: "c", Fleet: f, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	wait, cancel := runManager(t, m)
	ctx := context.Background()

	waitFor(t, "the Lease watch synced", func() bool {
		m.seenMu.Lock()
		defer m.seenMu.Unlock()
		_, ok := m.seen["fleetsync-c-shard-0"]
		return ok
	})
	if ok, why := m.Ready(); ok || !strings.Contains(why, "bootstrap") {
		t.Errorf("ready before the fleet's bootstrap: %v %q", ok, why)
	}
	if _, ok := replicaRenewTime(t, ctx, client); ok {
		t.Fatal("the replica Lease was written before the fleet's bootstrap")
	}

	close(f.bootstrap)
	f.waitFor(t, "the free shard led", func() bool { h := f.HeldShards(); return len(h) == 1 && h[0] == 1 })
	if ok, why := m.Ready(); !ok {
		t.Errorf("not ready after the first reconcile: %q", why)
	}
	if rt, ok := replicaRenewTime(t, ctx, client); !ok || !rt.Equal(t0) {
		t.Fatalf("replica Lease renewed at %s (exists %v), want %s", rt, ok, t0)
	}
	// The retry timer and the expiry timer of shard 0 are set.
	waitFor(t, "Run's two timers set", func() bool { return clock.Waiters() == 2 })

	clock.Step(2 * time.Second) // one retry period
	waitFor(t, "the renewal on the retry tick", func() bool {
		rt, _ := replicaRenewTime(t, ctx, client)
		return rt.Equal(t0.Add(2*time.Second)) && clock.Waiters() == 2
	})
	if h := f.HeldShards(); len(h) != 1 {
		t.Fatalf("holds %v 2 s after the dead holder's Lease was first seen, want only shard 1", h)
	}

	clock.Step(13*time.Second - time.Millisecond) // 1 ms before shard 0 expires
	waitFor(t, "the renewal on the next retry tick", func() bool {
		rt, _ := replicaRenewTime(t, ctx, client)
		return rt.Equal(t0.Add(15*time.Second-time.Millisecond)) && clock.Waiters() == 2
	})
	if h := f.HeldShards(); len(h) != 1 {
		t.Fatalf("holds %v 1 ms before shard 0's Lease expired, want only shard 1", h)
	}
	clock.Step(time.Millisecond) // the expiry timer alone
	f.waitFor(t, "shard 0 taken over", func() bool { return len(f.HeldShards()) == 2 })
	assertHolders(t, ctx, client, "me", "me")

	cancel()
	if err, ok := wait(); !ok || err != nil {
		t.Fatalf("Run returned %v (returned: %v) after its context ended, want nil", err, ok)
	}
	if _, ok := replicaRenewTime(t, ctx, client); ok {
		t.Error("the replica Lease is left after Run returned")
	}
	assertHolders(t, ctx, client, "", "")
	if h := f.HeldShards(); len(h) != 0 {
		t.Errorf("still holds %v after Run returned", h)
	}
}

// TestRunFailsWhenTheLeasesAreForbidden: a Lease watch the API server
// refuses (RBAC) stops Run with an error naming the namespace, instead of
// leaving a replica that holds no shard; it never gets ready.
func TestRunFailsWhenTheLeasesAreForbidden(t *testing.T) {
	m, _, err := runForbidden(t, "list", func(k8stesting.Action) (string, bool) { return "", true })
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "namespace leases") {
		t.Errorf("Run returned %v, want the Forbidden error naming the namespace", err)
	}
	if ok, _ := m.Ready(); ok {
		t.Error("ready with the Leases forbidden")
	}
}

// runForbidden runs a manager whose API server refuses the Lease requests
// of verb that refuse picks (naming the Lease), and returns once Run did.
func runForbidden(t *testing.T, verb string, refuse func(k8stesting.Action) (name string, refused bool)) (*Manager, *fakeFleet, error) {
	t.Helper()
	client := fake.NewClientset()
	client.PrependReactor(verb, "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if name, refused := refuse(a); refused {
			return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), name, errors.New("test: no RBAC"))
		}
		return false, nil, nil
	})
	m, f := newTestManager(t, client, newClock())
	wait, _ := runManager(t, m)
	err, ok := wait()
	if !ok {
		t.Fatalf("Run still runs with the Lease %s forbidden", verb)
	}
	return m, f, err
}

// TestRunFailsWhenTheReplicaLeaseIsForbidden: a replica that may watch the
// Leases but not write its own stops Run with the error, after giving up
// whatever it held.
func TestRunFailsWhenTheReplicaLeaseIsForbidden(t *testing.T) {
	m, f, err := runForbidden(t, "create", func(a k8stesting.Action) (string, bool) {
		name := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).Name
		return name, name == "fleetsync-c-replica-me"
	})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "fleetsync-c-replica-me") {
		t.Errorf("Run returned %v, want the Forbidden error naming the replica Lease", err)
	}
	if ok, _ := m.Ready(); ok {
		t.Error("ready with the replica Lease forbidden")
	}
	if h := f.HeldShards(); len(h) != 0 {
		t.Errorf("holds %v after Run failed", h)
	}
}

// TestOneWriterOfAShardLease: while shard 0's election runs here, the
// Manager's own writes of its Lease (release, take-over) are refused, so
// they never race the election's renewals; once the election is stopped
// and awaited, the release goes through.
func TestOneWriterOfAShardLease(t *testing.T) {
	clock := newClock()
	client := fake.NewClientset()
	conditionalUpdates(client)
	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 1, clock)
	mustReconcile(t, m, ctx, true)
	f.waitFor(t, "shard 0 led", func() bool { return len(f.HeldShards()) == 1 })

	m.release(0)
	assertHolders(t, ctx, client, "me")
	// Expired by this replica's sightings, and still not taken "over" by
	// hand: the election owns the Lease.
	clock.Step(time.Hour)
	if m.takeOver(ctx, 0) {
		t.Error("took over a Lease whose election runs here")
	}

	f.LoseShard(0)
	m.stopElector(0)
	m.release(0)
	assertHolders(t, ctx, client, "")
}

// TestNewRefusesBadConfig: the Manager checks what it needs.
func TestNewRefusesBadConfig(t *testing.T) {
	f, _ := newFleet(t)
	d := Deps{Client: fake.NewClientset(), ClusterID: "c", Fleet: f}
	for _, tt := range []struct {
		name string
		edit func(*Config, *Deps)
		want string
	}{
		{"one shard", func(c *Config, _ *Deps) { c.Shards = 1 }, "at least 2"},
		{"no replica id", func(c *Config, _ *Deps) { c.ReplicaID = "" }, "replica id"},
		{"no namespace", func(c *Config, _ *Deps) { c.Namespace = "" }, "lease namespace"},
		{"timing", func(c *Config, _ *Deps) { c.RenewDeadline = c.LeaseDuration }, "lease timing"},
		{"no fleet", func(_ *Config, d *Deps) { d.Fleet = nil }, "fleet"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, d := testConfig(2), d
			tt.edit(&c, &d)
			if _, err := New(c, d); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want an error about %q", err, tt.want)
			}
		})
	}
	if _, err := New(testConfig(2), d); err != nil {
		t.Errorf("New with a good config: %v", err)
	}
}

// newTestManager is a manager "me" of cluster c over client (two shards,
// testConfig's timing) with a fresh fake fleet.
func newTestManager(t *testing.T, client kubernetes.Interface, clk clock.Clock) (*Manager, *fakeFleet) {
	t.Helper()
	f, _ := newFleet(t)
	m, err := New(testConfig(2), Deps{Client: client, ClusterID: "c", Fleet: f, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return m, f
}
