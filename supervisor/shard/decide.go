package shard

import (
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetsync/fleetsync/k8s"
)

// Of returns the shard of a Service: a stable hash (FNV-1a) of
// "namespace/name" modulo n.
func Of(key k8s.Key, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key.String()))
	return int(h.Sum32() % uint32(n))
}

// sighting is when this replica last saw a Lease change, by its own clock
// (client-go's rule: other replicas' clocks are not trusted).
type sighting struct {
	rv     string
	spec   coordinationv1.LeaseSpec
	holder string
	at     time.Time
	first  bool // at is when this replica first listed the Lease, not a change
}

func newSighting(l *coordinationv1.Lease, at time.Time, first bool) sighting {
	return sighting{rv: l.ResourceVersion, spec: *l.Spec.DeepCopy(), holder: ptr.Deref(l.Spec.HolderIdentity, ""), at: at, first: first}
}

// changed is when the Lease last changed, for counting live replicas only.
// A Lease seen only in this replica's first list has an unknown age here;
// its holder's renew time stands in (so a Lease left by a crashed replica
// does not count as a live replica for the first seconds after a start).
// Its holder's clock may be off: that can only tilt the quota until the
// holder's next renewal is seen, never let two replicas hold one shard.
func (s sighting) changed() time.Time {
	if s.first && s.spec.RenewTime != nil && s.spec.RenewTime.Time.Before(s.at) {
		return s.spec.RenewTime.Time
	}
	return s.at
}

// view is what this replica sees of the Leases at one moment.
type view struct {
	now     time.Time
	live    int                     // replicas renewing their Lease, this one included
	holders map[int]string          // shard -> holder ("" or absent: free)
	until   map[int]time.Time       // shard -> when its Lease expires, by sightings here
	gone    []*coordinationv1.Lease // replica Leases left behind by a crash
}

// replicaLeaseGC: a replica Lease unchanged for this many lease durations
// belongs to a replica that crashed (a clean stop deletes its own) and is
// deleted, so pods that were killed do not leave Leases behind forever.
const replicaLeaseGC = 20

// see reads the Leases listed (those sighted; the others are skipped until
// their sighting). A replica is live while its Lease was seen to change
// within two retry periods and a second; a held shard expires one lease
// duration after its Lease was last seen to change.
func see(list []*coordinationv1.Lease, seen map[string]sighting, now time.Time, n names, cfg Config) view {
	v := view{now: now, holders: map[int]string{}, until: map[int]time.Time{}}
	shardPrefix := n.shardPrefix()
	for _, l := range list {
		s, ok := seen[l.Name]
		if !ok {
			continue
		}
		switch {
		case l.Labels[labelRole] == "replica":
			switch {
			case s.holder == n.identity:
			case s.holder != "" && now.Sub(s.changed()) < 2*cfg.RetryPeriod+time.Second:
				v.live++
			case now.Sub(s.at) >= replicaLeaseGC*cfg.LeaseDuration:
				v.gone = append(v.gone, l)
			}
		case strings.HasPrefix(l.Name, shardPrefix):
			k, err := strconv.Atoi(strings.TrimPrefix(l.Name, shardPrefix))
			if err == nil && k >= 0 && k < cfg.Shards && s.holder != "" {
				v.holders[k] = s.holder
				v.until[k] = s.at.Add(cfg.LeaseDuration)
			}
		}
	}
	v.live++ // this replica
	return v
}

// Situation is everything the decision of one reconcile reads: the Leases
// as this replica sees them, and the elections running here.
type Situation struct {
	Now      time.Time
	Identity string
	Shards   int
	Live     int               // live replicas, this one included (at least 1)
	Holders  map[int]string    // shard -> holder of its Lease ("" or absent: free)
	Until    map[int]time.Time // shard -> when its held Lease expires, by sightings here
	// Leading are the shards whose election leads here; Candidates those
	// whose election runs here without leading yet, each true when the
	// election's own last read found this replica holding the Lease.
	Leading    []int
	Candidates map[int]bool
}

// Plan is what one reconcile does, in this order.
type Plan struct {
	Quota int // ceil(Shards / Live)
	// HandOver: held shards beyond the quota, the least liked first: their
	// workers stop, their election ends, their Lease is released.
	HandOver []int
	// Withdraw: candidacies for shards someone else holds, as far as the
	// watch has seen (a candidacy whose own read found this replica
	// holding the Lease is kept: the watch may be behind).
	Withdraw []int
	// Resume: Leases naming this replica with no election here (an earlier
	// process of this replica, or a candidacy withdrawn on news the watch
	// had not caught up with): led again within the quota.
	Resume []int
	// Release: such Leases beyond the quota, released for the others.
	Release []int
	// Run: free shards to run for, within the quota.
	Run []int
	// TakeOver: shards whose holder stopped renewing (their Lease expired
	// by this replica's sightings), by preference; at most TakeOverSlots of
	// them are taken (a take-over can lose a race, then the next is tried).
	TakeOver      []int
	TakeOverSlots int
	// Next is when the next Lease held elsewhere expires (zero: none).
	Next time.Time
}

// Decide is the shard decision of one replica: which shards to give up,
// keep, run for and take over. It is a pure function of s.
func Decide(s Situation) Plan {
	live := max(s.Live, 1)
	p := Plan{Quota: (s.Shards + live - 1) / live}
	leading := append([]int(nil), s.Leading...)
	sortByRank(s.Identity, leading)
	mine := map[int]bool{}
	for len(leading) > p.Quota { // shed the shards we like least
		k := leading[len(leading)-1]
		leading = leading[:len(leading)-1]
		p.HandOver = append(p.HandOver, k)
	}
	for _, k := range leading {
		mine[k] = true
	}
	for k, acquired := range s.Candidates {
		if h := s.Holders[k]; h != "" && h != s.Identity && !acquired {
			p.Withdraw = append(p.Withdraw, k)
		} else {
			mine[k] = true
		}
	}
	sort.Ints(p.Withdraw)
	shed := map[int]bool{}
	for _, k := range p.HandOver {
		shed[k] = true
	}
	running := len(mine)
	var ours, free, expired []int
	for k := 0; k < s.Shards; k++ {
		switch h, until := s.Holders[k], s.Until[k]; {
		case mine[k], shed[k]:
		case h == s.Identity:
			ours = append(ours, k)
		case h == "":
			free = append(free, k)
		case !until.After(s.Now):
			expired = append(expired, k)
		case p.Next.IsZero() || until.Before(p.Next):
			p.Next = until
		}
	}
	sortByRank(s.Identity, ours)
	for _, k := range ours {
		if running < p.Quota {
			p.Resume = append(p.Resume, k)
			running++
		} else {
			p.Release = append(p.Release, k)
		}
	}
	sortByRank(s.Identity, free)
	for i := 0; i < len(free) && running < p.Quota; i++ {
		p.Run = append(p.Run, free[i])
		running++
	}
	sortByRank(s.Identity, expired)
	if running < p.Quota && len(expired) > 0 {
		p.TakeOver, p.TakeOverSlots = expired, p.Quota-running
	}
	return p
}

// rank is identity's preference for shard k (rendezvous hashing), so that
// replicas prefer different shards.
func rank(identity string, k int) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(identity + "/" + strconv.Itoa(k)))
	return h.Sum32()
}

// sortByRank orders shards by identity's preference, the most liked first.
func sortByRank(identity string, ks []int) {
	sort.Slice(ks, func(i, j int) bool { return rank(identity, ks[i]) > rank(identity, ks[j]) })
}
