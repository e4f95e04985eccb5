package shard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func forbidden(name string) error {
	return apierrors.NewForbidden(coordinationv1.Resource("leases"), name, errors.New("test: RBAC cache not synced"))
}

// TestRunSurvivesAForbiddenRenewalAfterItWorked: once its replica Lease
// was written, a 403 on a renewal (a restarted kube-apiserver answers 403
// until its RBAC cache has synced) does not end Run: the next renewal goes
// through. 403s lasting a lease duration do.
func TestRunSurvivesAForbiddenRenewalAfterItWorked(t *testing.T) {
	clock := newClock()
	t0 := clock.Now()
	client := fake.NewClientset()
	var refuse atomic.Bool
	var refused atomic.Int32
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).Name
		if name == "fleetsync-c-replica-me" && refuse.Load() {
			refused.Add(1)
			return true, nil, forbidden(name)
		}
		return false, nil, nil
	})
	conditionalUpdates(client)
	m, f := newTestManager(t, client, clock)
	wait, cancel := runManager(t, m)
	ctx := context.Background()
	f.waitFor(t, "both shards led", func() bool { return len(f.HeldShards()) == 2 })
	waitFor(t, "the retry timer set", func() bool { return clock.HasWaiters() })

	refuse.Store(true)
	clock.Step(2 * time.Second)
	waitFor(t, "a renewal refused", func() bool { return refused.Load() == 1 })
	refuse.Store(false)
	waitFor(t, "the retry timer set again", func() bool { return clock.HasWaiters() })
	clock.Step(2 * time.Second)
	waitFor(t, "the renewal after the 403", func() bool {
		rt, _ := replicaRenewTime(t, ctx, client)
		return rt.Equal(t0.Add(4 * time.Second))
	})

	cancel()
	if err, ok := wait(); !ok || err != nil {
		t.Fatalf("Run returned %v (returned %v), want nil once its context ended", err, ok)
	}
}

// TestForbidsAreFatalFirstOrWhenTheyLast: a 403 before the path ever
// worked ends Run at once; after, only 403s lasting the grace do, counted
// from the first since the last answer.
func TestForbidsAreFatalFirstOrWhenTheyLast(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const grace = 15 * time.Second
	var f forbids
	if !f.fatal(t0, grace) {
		t.Fatal("a 403 before any answer is not fatal")
	}
	f.answered()
	for _, tc := range []struct {
		after time.Duration
		want  bool
	}{{0, false}, {5 * time.Second, false}, {grace - time.Millisecond, false}, {grace, true}} {
		if got := f.fatal(t0.Add(tc.after), grace); got != tc.want {
			t.Errorf("403 %v after the first one: fatal %v, want %v", tc.after, got, tc.want)
		}
	}
	f.answered()
	if f.fatal(t0.Add(time.Hour), grace) {
		t.Error("the first 403 after an answer is fatal")
	}
}

// TestRunSurvivesAForbiddenWatchAfterItWorked: once the Lease watch has
// synced, a 403 on a re-watch does not end Run; the watch carries on.
func TestRunSurvivesAForbiddenWatchAfterItWorked(t *testing.T) {
	client := fake.NewClientset()
	first := watch.NewFake()
	var watches atomic.Int32
	client.PrependWatchReactor("leases", func(a k8stesting.Action) (bool, watch.Interface, error) {
		switch watches.Add(1) {
		case 1:
			return true, first, nil
		case 2:
			return true, nil, forbidden("")
		}
		return false, nil, nil
	})
	m, f := newTestManager(t, client, newClock())
	wait, cancel := runManager(t, m)
	f.waitFor(t, "both shards led", func() bool { return len(f.HeldShards()) == 2 })
	first.Stop() // the API server goes away: the reflector watches again
	waitFor(t, "the watch after the 403", func() bool { return watches.Load() >= 3 })
	cancel()
	if err, ok := wait(); !ok || err != nil {
		t.Fatalf("Run returned %v (returned %v), want nil once its context ended", err, ok)
	}
}

// TestRunFailsWhenTheLeaseWatchIsForbidden: a replica that may list the
// Leases but not watch them stops Run: a list that works does not make the
// watch's 403s passing ones.
func TestRunFailsWhenTheLeaseWatchIsForbidden(t *testing.T) {
	client := fake.NewClientset()
	client.PrependWatchReactor("leases", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, forbidden("")
	})
	m, _ := newTestManager(t, client, newClock())
	wait, _ := runManager(t, m)
	if err, ok := wait(); !ok || !apierrors.IsForbidden(err) {
		t.Fatalf("Run returned %v (returned %v), want the watch's Forbidden error", err, ok)
	}
}
