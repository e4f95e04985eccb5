package shard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

func shardLease(name, holder string, renew time.Time) *coordinationv1.Lease {
	t := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "leases", Labels: map[string]string{labelCluster: "c", labelRole: "shard"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &t, AcquireTime: &t,
			LeaseDurationSeconds: ptr.To(int32(15)), LeaseTransitions: ptr.To(int32(4))},
	}
}

// TestTakeOverCountsFromTheLastSighting: a shard held by a replica that
// stopped renewing is taken one lease duration after its Lease was last
// seen to change (by this replica's clock, whatever the Lease's own
// timestamps say), not earlier, with an update that names this replica,
// and its workers start.
func TestTakeOverCountsFromTheLastSighting(t *testing.T) {
	clock := newClock()
	// The dead replica's clock is an hour ahead: its renewal timestamps say
	// nothing about when this replica may take over.
	ahead := clock.Now().Add(time.Hour)
	client := fake.NewClientset(shardLease("fleetsync-c-shard-0", "dead", ahead), shardLease("fleetsync-c-shard-1", "dead", ahead))

	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 2, clock)
	t0 := clock.Now()

	if next := mustReconcile(t, m, ctx, true); !next.Equal(t0.Add(15 * time.Second)) {
		t.Fatalf("next expiry %s, want one lease duration after the first sighting (%s)", next, t0.Add(15*time.Second))
	}
	assertHolders(t, ctx, client, "dead", "dead")

	// Shard 1's holder renews 10 s in: its lease duration starts again.
	clock.Step(10 * time.Second)
	renewLease(t, ctx, client, "fleetsync-c-shard-1", ahead.Add(10*time.Second))
	f.waitFor(t, "the renewal sighted", func() bool {
		m.seenMu.Lock()
		defer m.seenMu.Unlock()
		return m.seen["fleetsync-c-shard-1"].at.Equal(clock.Now())
	})
	clock.Step(5*time.Second - time.Millisecond)
	mustReconcile(t, m, ctx, false)
	assertHolders(t, ctx, client, "dead", "dead") // 1 ms before shard 0 expires

	clock.Step(time.Millisecond) // t0 + 15 s: shard 0 expired, shard 1 renewed at t0 + 10 s
	if next := mustReconcile(t, m, ctx, false); !next.Equal(t0.Add(25 * time.Second)) {
		t.Fatalf("next expiry %s, want shard 1's at %s", next, t0.Add(25*time.Second))
	}
	assertHolders(t, ctx, client, "me", "dead")
	f.waitFor(t, "shard 0 gained", func() bool { return len(f.HeldShards()) == 1 && f.HeldShards()[0] == 0 })
	l, err := client.CoordinationV1().Leases("leases").Get(ctx, "fleetsync-c-shard-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "me" || ptr.Deref(l.Spec.LeaseTransitions, 0) != 5 {
		t.Errorf("shard 0's lease: holder %q transitions %d, want me and 5", h, ptr.Deref(l.Spec.LeaseTransitions, 0))
	}

	clock.Step(10 * time.Second)
	mustReconcile(t, m, ctx, false)
	assertHolders(t, ctx, client, "me", "me")
	f.waitFor(t, "shard 1 gained", func() bool { return len(f.HeldShards()) == 2 })
}

// TestTakeOverLeavesALeaseTakenMeanwhile: another replica takes an expired
// shard first; its update is in this replica's Lease store while the
// watch handler has not sighted it yet (the store is written first). This
// replica must not update that newer copy: it would steal a shard the other
// replica already leads.
func TestTakeOverLeavesALeaseTakenMeanwhile(t *testing.T) {
	clock := newClock()
	client := fake.NewClientset(shardLease("fleetsync-c-shard-0", "dead", clock.Now()))
	conditionalUpdates(client)
	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 1, clock)
	m.seenMu.Lock()
	expired := m.seen["fleetsync-c-shard-0"]
	m.seenMu.Unlock()
	clock.Step(15 * time.Second)

	api := client.CoordinationV1().Leases("leases")
	l, err := api.Get(ctx, "fleetsync-c-shard-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr.To("other")
	if _, err := api.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, "the other replica's takeover sighted", func() bool {
		m.seenMu.Lock()
		defer m.seenMu.Unlock()
		return m.seen["fleetsync-c-shard-0"].holder == "other"
	})
	m.seenMu.Lock()
	m.seen["fleetsync-c-shard-0"] = expired // as if the handler had not run yet
	m.seenMu.Unlock()

	if m.takeOver(ctx, 0) {
		t.Error("took over a Lease that changed after the sighting that expired")
	}
	assertHolders(t, ctx, client, "other")
}

// TestTakeOverIsSightedAtOnce: right after a takeover neither the watch nor
// the shard's election has caught up yet (here: the watch delivers nothing
// after the first list and the election's reads fail). The next reconcile
// must keep that candidacy, not take it for a race lost to the old holder:
// stopping it would leave the Lease naming this replica with nobody
// renewing it, and the shard unsynced for a whole lease duration.
func TestTakeOverIsSightedAtOnce(t *testing.T) {
	clock := newClock()
	client := fake.NewClientset(shardLease("fleetsync-c-shard-0", "dead", clock.Now()))
	conditionalUpdates(client)
	client.PrependWatchReactor("leases", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, watch.NewFake(), nil
	})
	var failGets atomic.Bool
	failGets.Store(true)
	client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failGets.Load() {
			return true, nil, apierrors.NewServiceUnavailable("test: the election's reads fail")
		}
		return false, nil, nil
	})
	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 1, clock)
	t.Cleanup(func() { failGets.Store(false) }) // before the manager's shutdown reads its Leases

	clock.Step(15 * time.Second)
	mustReconcile(t, m, ctx, false)
	holders := func() string {
		ls, err := client.CoordinationV1().Leases("leases").List(ctx, metav1.ListOptions{})
		if err != nil || len(ls.Items) != 1 {
			t.Fatalf("listing leases: %v", err)
		}
		return ptr.Deref(ls.Items[0].Spec.HolderIdentity, "")
	}
	if h := holders(); h != "me" {
		t.Fatalf("shard 0 held by %q after its lease expired, want me", h)
	}
	m.reconcile(ctx, false) // as after any watch event
	m.electorsMu.Lock()
	_, running := m.electors[0]
	m.electorsMu.Unlock()
	if !running {
		t.Fatal("the election for the shard just taken over was stopped")
	}
	failGets.Store(false)
	f.waitFor(t, "shard 0 led", func() bool { return len(f.HeldShards()) == 1 })
	if h := holders(); h != "me" {
		t.Errorf("shard 0 held by %q, want me", h)
	}
}

// TestResumesShardsNamingThisReplica: a replica whose container restarted in
// its pod keeps its name, and finds Leases naming it that nobody renews (and
// nobody else may take for a lease duration). It leads those within its
// quota at once, without waiting for them to expire, and releases the rest.
func TestResumesShardsNamingThisReplica(t *testing.T) {
	clock := newClock()
	now := clock.Now()
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-c-replica-other", Namespace: "leases",
		Labels: map[string]string{labelCluster: "c", labelRole: "replica"}}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("other")}}
	client := fake.NewClientset(shardLease("fleetsync-c-shard-0", "me", now), shardLease("fleetsync-c-shard-1", "me", now), other)
	conditionalUpdates(client)
	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 2, clock)

	m.reconcile(ctx, true) // quota ceil(2/2) = 1, the clock has not moved
	f.waitFor(t, "one shard led", func() bool { return len(f.HeldShards()) == 1 })
	held := f.HeldShards()[0]
	want := []string{"me", "me"}
	want[1-held] = ""
	assertHolders(t, ctx, client, want...)
}

// TestStaleReplicaLeaseAtStart: a replica starting next to the Lease of a
// replica that crashed a minute ago does not count that one as live (which
// would halve its quota for the first seconds), while a Lease renewed a
// second ago, by its holder's clock, counts at once.
func TestStaleReplicaLeaseAtStart(t *testing.T) {
	clock := newClock()
	replica := func(holder string, renewed time.Time) *coordinationv1.Lease {
		mt := metav1.NewMicroTime(renewed)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-c-replica-" + holder, Namespace: "leases",
			Labels: map[string]string{labelCluster: "c", labelRole: "replica"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &mt}}
	}
	client := fake.NewClientset(replica("crashed", clock.Now().Add(-time.Minute)), replica("live", clock.Now().Add(-time.Second)))
	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 4, clock)

	if v := m.observe(); v.live != 2 {
		t.Errorf("%d live replicas at start, want 2 (this one and the one renewed a second ago)", v.live)
	}
	m.reconcile(ctx, true) // quota ceil(4/2)
	f.waitFor(t, "two shards led", func() bool { return len(f.HeldShards()) == 2 })
	clock.Step(5 * time.Second) // no renewal sighted since the start: "live" is not live any more
	if v := m.observe(); v.live != 1 {
		t.Errorf("%d live replicas after 5 s without a renewal, want 1", v.live)
	}
}

// TestDuplicateReplicaIDIsReported: renewals of this replica's Lease that
// it did not write (another process with the same --replica-id) are counted
// and, from the second on, logged as an error; its own renewals, and the
// Lease an earlier process left before the first renewal, are not.
func TestDuplicateReplicaIDIsReported(t *testing.T) {
	clock := newClock()
	left := metav1.NewMicroTime(clock.Now().Add(-time.Second))
	client := fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-c-replica-me", Namespace: "leases",
		Labels: map[string]string{labelCluster: "c", labelRole: "replica"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("me"), RenewTime: &left}})
	f, ctx := newFleet(t)
	var logs lockedBuffer
	m := startManagerLog(t, ctx, client, f, 1, clock, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Error}))
	foreign := func() int {
		m.seenMu.Lock()
		defer m.seenMu.Unlock()
		return m.foreign
	}
	sighted := func(what string, at time.Time) {
		t.Helper()
		f.waitFor(t, what, func() bool {
			m.seenMu.Lock()
			defer m.seenMu.Unlock()
			rt := m.seen["fleetsync-c-replica-me"].spec.RenewTime
			return rt != nil && rt.Time.Equal(at)
		})
	}

	for range 3 { // this replica's own renewals
		clock.Step(2 * time.Second)
		mustReconcile(t, m, ctx, true)
		sighted("own renewal", clock.Now())
	}
	if n := foreign(); n != 0 {
		t.Fatalf("%d foreign renewals counted among this replica's own and the Lease left at start", n)
	}
	twin := clock.Now().Add(700 * time.Millisecond) // the other process's clock
	renewLease(t, ctx, client, "fleetsync-c-replica-me", twin)
	sighted("the twin's renewal", twin)
	if n := foreign(); n != 1 || strings.Contains(logs.String(), "must be unique") {
		t.Fatalf("after one foreign renewal: counted %d, logged %q; want 1 and no log yet", n, logs.String())
	}
	renewLease(t, ctx, client, "fleetsync-c-replica-me", twin.Add(2*time.Second))
	sighted("the twin's second renewal", twin.Add(2*time.Second))
	if n := foreign(); n != 2 || !strings.Contains(logs.String(), "--replica-id must be unique") {
		t.Errorf("after two foreign renewals: counted %d, logged %q; want 2 and the error", n, logs.String())
	}
}

// TestTakeOverKeepsTheQuota: with a second live replica, this one takes at
// most ceil(shards/2) of a dead replica's shards.
func TestTakeOverKeepsTheQuota(t *testing.T) {
	clock := newClock()
	now := clock.Now()
	client := fake.NewClientset(
		shardLease("fleetsync-c-shard-0", "dead", now), shardLease("fleetsync-c-shard-1", "dead", now),
		shardLease("fleetsync-c-shard-2", "dead", now), shardLease("fleetsync-c-shard-3", "dead", now))
	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 4, clock)
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-c-replica-other", Namespace: "leases",
		Labels: map[string]string{labelCluster: "c", labelRole: "replica"}}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("other")}}
	if _, err := client.CoordinationV1().Leases("leases").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, "the other replica sighted", func() bool {
		m.seenMu.Lock()
		defer m.seenMu.Unlock()
		_, ok := m.seen["fleetsync-c-replica-other"]
		return ok
	})
	clock.Step(15 * time.Second)
	renewLease(t, ctx, client, "fleetsync-c-replica-other", clock.Now())
	f.waitFor(t, "the other replica's renewal sighted", func() bool {
		m.seenMu.Lock()
		defer m.seenMu.Unlock()
		return m.seen["fleetsync-c-replica-other"].at.Equal(clock.Now())
	})
	mustReconcile(t, m, ctx, true)
	mustReconcile(t, m, ctx, false)
	f.waitFor(t, "two shards gained", func() bool { return len(f.HeldShards()) == 2 })
	if held := f.HeldShards(); len(held) != 2 {
		t.Fatalf("holds %v with another live replica and 4 shards, want 2", held)
	}
}

// conditionalUpdates makes the fake clientset's Lease updates conditional
// on the resourceVersion, as the API server's are: an update naming another
// version than the stored one is a conflict, and each update stores a new
// version.
func conditionalUpdates(c *fake.Clientset) {
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	var mu sync.Mutex
	version := 0
	c.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		cur, err := c.Tracker().Get(gvr, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		if rv := cur.(*coordinationv1.Lease).ResourceVersion; l.ResourceVersion != rv {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), l.Name, fmt.Errorf("version %q, stored %q", l.ResourceVersion, rv))
		}
		version++
		l.ResourceVersion = strconv.Itoa(version)
		return false, nil, nil // the tracker stores it
	})
}

// assertHolders checks the holders of shard Leases 0, 1, ... in the API.
func assertHolders(t *testing.T, ctx context.Context, c kubernetes.Interface, want ...string) {
	t.Helper()
	for k, w := range want {
		l, err := c.CoordinationV1().Leases("leases").Get(ctx, fmt.Sprintf("fleetsync-c-shard-%d", k), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != w {
			t.Fatalf("shard %d held by %q, want %q", k, h, w)
		}
	}
}

// startManager runs the shard watch of a manager "me" of cluster c (15 s
// leases, sightings on clock) until the test ends; the test drives
// reconcile itself.
func startManager(t *testing.T, ctx context.Context, client kubernetes.Interface, f *fakeFleet, shards int, clock clock.Clock) *Manager {
	t.Helper()
	return startManagerLog(t, ctx, client, f, shards, clock, nil)
}

func startManagerLog(t *testing.T, ctx context.Context, client kubernetes.Interface, f *fakeFleet, shards int, clock clock.Clock, log hclog.Logger) *Manager {
	t.Helper()
	m := newManager(testConfig(shards), Deps{Client: client, ClusterID: "c", Fleet: f, Clock: clock, Log: log})
	stop, err := m.watch(ctx)
	t.Cleanup(func() { m.shutdown(); stop() })
	if err != nil || ctx.Err() != nil {
		t.Fatalf("lease watch did not sync: %v", err)
	}
	return m
}

func renewLease(t *testing.T, ctx context.Context, c kubernetes.Interface, name string, at time.Time) {
	t.Helper()
	api := c.CoordinationV1().Leases("leases")
	l, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mt := metav1.NewMicroTime(at)
	l.Spec.RenewTime = &mt
	if _, err := api.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCrashedReplicaLeasesAreDeleted: a replica Lease unchanged for 20
// lease durations (a replica killed for good) is deleted; this replica's own
// Lease and a shard Lease are not.
func TestCrashedReplicaLeasesAreDeleted(t *testing.T) {
	clock := newClock()
	crashed := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-c-replica-crashed", Namespace: "leases",
		Labels: map[string]string{labelCluster: "c", labelRole: "replica"}}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("crashed")}}
	client := fake.NewClientset(crashed, shardLease("fleetsync-c-shard-0", "crashed", clock.Now()))
	f, ctx := newFleet(t)
	m := startManager(t, ctx, client, f, 2, clock)
	exists := func(name string) bool {
		_, err := client.CoordinationV1().Leases("leases").Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	clock.Step(20*15*time.Second - time.Second)
	mustReconcile(t, m, ctx, true)
	if !exists("fleetsync-c-replica-crashed") {
		t.Fatal("deleted a replica lease 1 s before its time")
	}
	clock.Step(time.Second)
	mustReconcile(t, m, ctx, true)
	if exists("fleetsync-c-replica-crashed") {
		t.Error("a replica lease unchanged for 20 lease durations is still there")
	}
	if !exists("fleetsync-c-replica-me") || !exists("fleetsync-c-shard-0") {
		t.Error("deleted this replica's own lease or a shard lease")
	}
}
