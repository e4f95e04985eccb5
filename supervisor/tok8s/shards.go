package tok8s

import (
	"sync"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/supervisor/shard"
)

// Shards is the set of shards this replica holds, as the fleet's shard
// Manager decides it (--shards): a unit belongs to shard
// shard.Of(namespace/name), the same hash and the same Leases as the
// Kubernetes -> Consul Services, and only the holder runs its worker (and
// so its health watch). The daemon passes the Manager's GainShard and
// LoseShard calls to Gain and Lose. A nil *Shards holds every unit.
type Shards struct {
	n int

	mu   sync.Mutex
	held map[int]bool
	sup  *Supervisor // set by Run; told of every change
}

// NewShards returns the shards of n (none held until Gain).
func NewShards(n int) *Shards { return &Shards{n: n, held: map[int]bool{}} }

// Holds reports whether unit k's shard is held here.
func (s *Shards) Holds(k owned.Key) bool {
	if s == nil || s.n <= 1 {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[s.of(k)]
}

func (s *Shards) of(k owned.Key) int {
	return shard.Of(k8s.Key{Namespace: k.Namespace, Name: k.Name}, s.n)
}

// Gain starts the workers of shard k's units (once the gate is open).
func (s *Shards) Gain(k int) {
	s.mu.Lock()
	s.held[k] = true
	sup := s.sup
	s.mu.Unlock()
	if sup != nil {
		sup.reconcile()
	}
}

// Lose stops the workers of shard k's units and returns once they have
// ended; nothing is written or deleted because of it (the next holder
// carries on).
func (s *Shards) Lose(k int) {
	s.mu.Lock()
	delete(s.held, k)
	sup := s.sup
	s.mu.Unlock()
	if sup != nil {
		sup.stopShard(k)
	}
}

func (s *Shards) attach(sup *Supervisor) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sup = sup
}

// stopShard stops the workers of shard k and waits for them.
func (s *Supervisor) stopShard(k int) {
	s.mu.Lock()
	var stopping []*running
	for key, r := range s.workers {
		if s.opts.Shards.of(key) == k {
			r.cancel()
			stopping = append(stopping, r)
		}
	}
	s.mu.Unlock()
	for _, r := range stopping {
		<-r.done
	}
	if len(stopping) > 0 {
		s.log.Info("Shard lost; its to-k8s workers stopped", "shard", k, "workers", len(stopping))
	}
}
