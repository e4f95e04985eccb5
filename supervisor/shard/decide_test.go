package shard

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetsync/fleetsync/k8s"
)

func TestOfIsStableAndSpread(t *testing.T) {
	counts := make([]int, 8)
	for i := range 800 {
		k := k8s.Key{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
		s := Of(k, 8)
		if s != Of(k, 8) {
			t.Fatal("Of is not stable")
		}
		counts[s]++
	}
	for s, n := range counts {
		if n < 50 || n > 150 {
			t.Errorf("shard %d has %d of 800 services: badly spread %v", s, n, counts)
		}
	}
	if Of(k8s.Key{Namespace: "a", Name: "b"}, 1) != 0 {
		t.Error("one shard must be shard 0")
	}
}

// byRank is ks in the order "me" prefers them.
func byRank(ks ...int) []int {
	out := append([]int(nil), ks...)
	sortByRank("me", out)
	return out
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	all4 := byRank(0, 1, 2, 3)
	tests := []struct {
		name string
		s    Situation
		want Plan
	}{
		{
			name: "alone, every shard free: run for all",
			s:    Situation{Shards: 4, Live: 1},
			want: Plan{Quota: 4, Run: all4},
		},
		{
			name: "two live replicas, every shard free: run for the two liked most",
			s:    Situation{Shards: 4, Live: 2},
			want: Plan{Quota: 2, Run: all4[:2]},
		},
		{
			name: "no live replica counted: as alone",
			s:    Situation{Shards: 2, Live: 0},
			want: Plan{Quota: 2, Run: byRank(0, 1)},
		},
		{
			name: "a replica joined: hand over the shards liked least",
			s: Situation{Shards: 4, Live: 2, Leading: []int{0, 1, 2, 3},
				Holders: map[int]string{0: "me", 1: "me", 2: "me", 3: "me"}},
			want: Plan{Quota: 2, HandOver: []int{all4[3], all4[2]}},
		},
		{
			name: "at the quota: a free shard is left for the others",
			s:    Situation{Shards: 2, Live: 2, Leading: []int{0}, Holders: map[int]string{0: "me"}},
			want: Plan{Quota: 1},
		},
		{
			name: "a candidacy for a shard another replica took is withdrawn",
			s: Situation{Now: now, Shards: 2, Live: 2, Candidates: map[int]bool{1: false},
				Holders: map[int]string{1: "other"}, Until: map[int]time.Time{1: now.Add(5 * time.Second)}},
			want: Plan{Quota: 1, Withdraw: []int{1}, Run: []int{0}, Next: now.Add(5 * time.Second)},
		},
		{
			name: "a candidacy whose own read found this replica is kept (the watch is behind)",
			s: Situation{Now: now, Shards: 2, Live: 2, Candidates: map[int]bool{1: true},
				Holders: map[int]string{1: "other"}, Until: map[int]time.Time{1: now.Add(5 * time.Second)}},
			want: Plan{Quota: 1},
		},
		{
			name: "a candidacy for a free shard is kept and counts",
			s:    Situation{Shards: 2, Live: 2, Candidates: map[int]bool{0: false}},
			want: Plan{Quota: 1},
		},
		{
			name: "Leases naming this replica with no election: resumed within the quota, the rest released",
			s:    Situation{Shards: 2, Live: 2, Holders: map[int]string{0: "me", 1: "me"}},
			want: Plan{Quota: 1, Resume: byRank(0, 1)[:1], Release: byRank(0, 1)[1:]},
		},
		{
			name: "a shard handed over is neither resumed nor released again in the same pass",
			s:    Situation{Shards: 2, Live: 2, Leading: []int{0, 1}, Holders: map[int]string{0: "me", 1: "me"}},
			want: Plan{Quota: 1, HandOver: byRank(0, 1)[1:]},
		},
		{
			name: "expired Leases of a dead holder: all offered for take-over, as many slots as the quota leaves",
			s: Situation{Now: now, Shards: 4, Live: 2,
				Holders: map[int]string{0: "dead", 1: "dead", 2: "dead", 3: "dead"},
				Until:   map[int]time.Time{0: now, 1: now, 2: now.Add(-time.Second), 3: now}},
			want: Plan{Quota: 2, TakeOver: all4, TakeOverSlots: 2},
		},
		{
			name: "free shards come before expired ones",
			s: Situation{Now: now, Shards: 2, Live: 1,
				Holders: map[int]string{0: "dead"}, Until: map[int]time.Time{0: now}},
			want: Plan{Quota: 2, Run: []int{1}, TakeOver: []int{0}, TakeOverSlots: 1},
		},
		{
			name: "no slot left: nothing offered for take-over",
			s: Situation{Now: now, Shards: 2, Live: 2, Leading: []int{1},
				Holders: map[int]string{0: "dead", 1: "me"}, Until: map[int]time.Time{0: now}},
			want: Plan{Quota: 1},
		},
		{
			name: "held elsewhere, not expired: wait for the earliest expiry",
			s: Situation{Now: now, Shards: 3, Live: 1, Leading: []int{2},
				Holders: map[int]string{0: "a", 1: "b", 2: "me"},
				Until:   map[int]time.Time{0: now.Add(5 * time.Second), 1: now.Add(3 * time.Second), 2: now.Add(time.Second)}},
			want: Plan{Quota: 3, Next: now.Add(3 * time.Second)},
		},
		{
			name: "a candidacy withdrawn from an expired Lease is offered for take-over in the same pass",
			s: Situation{Now: now, Shards: 1, Live: 1, Candidates: map[int]bool{0: false},
				Holders: map[int]string{0: "dead"}, Until: map[int]time.Time{0: now.Add(-time.Second)}},
			want: Plan{Quota: 1, Withdraw: []int{0}, TakeOver: []int{0}, TakeOverSlots: 1},
		},
		{
			name: "one expires exactly now: expired (not after now)",
			s: Situation{Now: now, Shards: 1, Live: 1,
				Holders: map[int]string{0: "dead"}, Until: map[int]time.Time{0: now}},
			want: Plan{Quota: 1, TakeOver: []int{0}, TakeOverSlots: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.s.Identity = "me"
			if got := Decide(tt.s); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decide:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestRankSpreadsPreferences: two replicas do not prefer the same order
// of shards (rendezvous hashing), so that they run for different ones.
func TestRankSpreadsPreferences(t *testing.T) {
	a, b := []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{0, 1, 2, 3, 4, 5, 6, 7}
	sortByRank("replica-a", a)
	sortByRank("replica-b", b)
	if reflect.DeepEqual(a, b) {
		t.Errorf("replicas a and b rank shards alike: %v", a)
	}
	c := append([]int(nil), a...)
	sortByRank("replica-a", c)
	if !reflect.DeepEqual(a, c) {
		t.Errorf("ranking is not stable: %v then %v", a, c)
	}
}

func TestSee(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	n := names{cluster: "c", identity: "me"}
	cfg := testConfig(4) // 2 s retry: live while changed within 5 s; 15 s leases
	lease := func(name, role, holder string, renewed time.Time) *coordinationv1.Lease {
		mt := metav1.NewMicroTime(renewed)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1",
			Labels: map[string]string{labelCluster: "c", labelRole: role}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &mt}}
	}
	replica := func(holder string) *coordinationv1.Lease {
		return lease("fleetsync-c-replica-"+holder, "replica", holder, now)
	}
	tests := []struct {
		name  string
		list  []*coordinationv1.Lease
		seen  map[string]time.Time // Lease name -> sighted at (a change, not the first list)
		first map[string]time.Time // Lease name -> first listed at
		want  view
	}{
		{
			name: "this replica's own Lease does not count twice",
			list: []*coordinationv1.Lease{replica("me")},
			seen: map[string]time.Time{"fleetsync-c-replica-me": now},
			want: view{live: 1},
		},
		{
			name: "a replica whose Lease changed within two retry periods and a second is live",
			list: []*coordinationv1.Lease{replica("a"), replica("b")},
			seen: map[string]time.Time{"fleetsync-c-replica-a": now.Add(-4999 * time.Millisecond), "fleetsync-c-replica-b": now.Add(-5 * time.Second)},
			want: view{live: 2},
		},
		{
			name:  "a Lease first listed counts by its renew time",
			list:  []*coordinationv1.Lease{lease("fleetsync-c-replica-old", "replica", "old", now.Add(-time.Minute)), lease("fleetsync-c-replica-new", "replica", "new", now.Add(-time.Second))},
			first: map[string]time.Time{"fleetsync-c-replica-old": now, "fleetsync-c-replica-new": now},
			want:  view{live: 2},
		},
		{
			name: "a replica Lease unchanged for 20 lease durations is gone",
			list: []*coordinationv1.Lease{replica("crashed"), replica("late")},
			seen: map[string]time.Time{"fleetsync-c-replica-crashed": now.Add(-300 * time.Second), "fleetsync-c-replica-late": now.Add(-299 * time.Second)},
			want: view{live: 1, gone: []*coordinationv1.Lease{replica("crashed")}},
		},
		{
			name: "held shards expire a lease duration after their last sighting; free, unknown and unsighted ones are left out",
			list: []*coordinationv1.Lease{
				lease("fleetsync-c-shard-0", "shard", "a", now.Add(time.Hour)),
				lease("fleetsync-c-shard-1", "shard", "", now),
				lease("fleetsync-c-shard-4", "shard", "a", now),
				lease("fleetsync-c-shard-x", "shard", "a", now),
				lease("fleetsync-c-shard-2", "shard", "b", now),
			},
			seen: map[string]time.Time{"fleetsync-c-shard-0": now.Add(-time.Second), "fleetsync-c-shard-1": now,
				"fleetsync-c-shard-4": now, "fleetsync-c-shard-x": now},
			want: view{live: 1, holders: map[int]string{0: "a"}, until: map[int]time.Time{0: now.Add(14 * time.Second)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[string]sighting{}
			for _, l := range tt.list {
				if at, ok := tt.seen[l.Name]; ok {
					seen[l.Name] = newSighting(l, at, false)
				}
				if at, ok := tt.first[l.Name]; ok {
					seen[l.Name] = newSighting(l, at, true)
				}
			}
			tt.want.now = now
			if tt.want.holders == nil {
				tt.want.holders, tt.want.until = map[int]string{}, map[int]time.Time{}
			}
			if got := see(tt.list, seen, now, n, cfg); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("see:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
