package shard

import (
	"errors"
	"slices"
	"strings"
	"testing"

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
