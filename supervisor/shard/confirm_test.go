package shard

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

func leaseOf(holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)}}
}

func TestLostShards(t *testing.T) {
	for _, tc := range []struct {
		name   string
		held   []int
		leases map[int]*coordinationv1.Lease
		want   []int
	}{
		{"all still ours", []int{0, 1}, map[int]*coordinationv1.Lease{0: leaseOf("me"), 1: leaseOf("me")}, nil},
		{"one taken by another replica", []int{0, 1}, map[int]*coordinationv1.Lease{0: leaseOf("me"), 1: leaseOf("other")}, []int{1}},
		{"one released", []int{0, 1}, map[int]*coordinationv1.Lease{0: leaseOf(""), 1: leaseOf("me")}, []int{0}},
		{"one gone", []int{3}, map[int]*coordinationv1.Lease{3: nil}, []int{3}},
		{"no holder field", []int{2}, map[int]*coordinationv1.Lease{2: {}}, []int{2}},
		{"nothing held", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := lostShards("me", tc.held, tc.leases); !slices.Equal(got, tc.want) {
				t.Fatalf("lostShards = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestConfirmReadsTheAPIServer: Confirm reads each held shard's Lease
// (a GET, not the watch's cache) and returns those not naming this
// replica, which the next reconcile hands over; a read that fails makes it
// an error naming the Lease.
func TestConfirmReadsTheAPIServer(t *testing.T) {
	client := fake.NewClientset(
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-c-shard-0", Namespace: "leases"}, Spec: leaseOf("me").Spec},
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-c-shard-1", Namespace: "leases"}, Spec: leaseOf("r2").Spec},
	)
	m, _ := newTestManager(t, client, newClock())
	lost, err := m.Confirm(t.Context(), []int{0, 1, 2})
	if err != nil || !slices.Equal(lost, []int{1, 2}) {
		t.Fatalf("Confirm = %v, %v; want [1 2] (taken, gone)", lost, err)
	}
	fenced := m.takeFenced()
	slices.Sort(fenced)
	if !slices.Equal(fenced, []int{1, 2}) {
		t.Fatalf("shards to hand over at the next reconcile: %v, want [1 2]", fenced)
	}
	client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if _, err := m.Confirm(t.Context(), []int{0}); err == nil || !strings.Contains(err.Error(), "leases/fleetsync-c-shard-0") {
		t.Fatalf("Confirm with the API server away: %v, want an error naming the lease", err)
	}
}

// TestPauseHandsOverTakenShardsAtOnce: a retry tick late by more than a
// retry period (the process was stopped) reads the held shards' Leases; a
// shard another replica took meanwhile is handed over at once (its
// workers stop), long before its election would notice after
// RenewDeadline (10 s).
func TestPauseHandsOverTakenShardsAtOnce(t *testing.T) {
	clk := newClock()
	client := fake.NewClientset()
	conditionalUpdates(client)
	m, f := newTestManager(t, client, clk)
	runManager(t, m)
	f.waitFor(t, "both shards led", func() bool { return len(f.HeldShards()) == 2 })
	waitFor(t, "Run's timers set", func() bool { return clk.Waiters() >= 1 })

	// Another replica took shard 0 while this one was stopped.
	l, err := client.CoordinationV1().Leases("leases").Get(t.Context(), "fleetsync-c-shard-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr.To("r2")
	if _, err := client.CoordinationV1().Leases("leases").Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	clk.Step(30 * time.Second) // the pause, as the retry timer sees it
	f.waitFor(t, "shard 0 handed over", func() bool { h := f.HeldShards(); return len(h) == 1 && h[0] == 1 })
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shard 0 handed over %s after the pause: the election's own deadline, not the Lease read", took)
	}
}
