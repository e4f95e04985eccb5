package supervisor

import (
	"context"
	"sort"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/shard"
	"github.com/fleetsync/fleetsync/worker"
)

// The supervisor's side of sharding: it is the shard.Fleet of the
// shard.Manager, which decides which shards this replica holds.
var _ shard.Fleet = (*Supervisor)(nil)

// holds reports whether this replica holds the shard of key. It takes
// shardMu (only when sharded), never mu, so callers may hold mu.
func (s *Supervisor) holds(key k8s.Key) bool {
	if s.opts.Shards <= 1 {
		return true
	}
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	return s.held[shard.Of(key, s.opts.Shards)]
}

// HeldShards returns the shards this replica holds, sorted.
func (s *Supervisor) HeldShards() []int {
	if s.opts.Shards <= 1 {
		return []int{0}
	}
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	out := make([]int, 0, len(s.held))
	for k := range s.held {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// GainShard makes this replica sync the Services of shard k. It first
// takes the shard's fence (Options.Fencing), retrying while Consul does not
// answer. Before
// bootstrap it only records the shard (bootstrap starts its workers); after,
// it reads the owned state of our node once and starts a worker for every
// selected Service of the shard and every Service of the shard with owned
// instances, each handed its owned state (so Services already right in
// Consul cost no write). It returns early only if ctx ends.
func (s *Supervisor) GainShard(ctx context.Context, k int) {
	fence, ok := s.takeFence(ctx, k)
	if !ok {
		return
	}
	s.shardMu.Lock()
	if ctx.Err() != nil {
		// Leading ended while the fence was taken: LoseShard ran (or
		// runs) for a shard never marked held; it must stay so.
		s.shardMu.Unlock()
		return
	}
	s.held[k] = true
	if fence != nil {
		s.fences[k] = fence
	}
	s.shardMu.Unlock()
	s.opts.Hooks.Shards.ShardGained(k)
	s.log.Info("Shard gained", "shard", k)
	if !s.bootstrapped.Load() {
		return
	}
	st, err := s.readOwned(ctx)
	if err != nil {
		return
	}
	owned := st.held
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	for _, key := range s.opts.Watcher.Keys() {
		if _, ok := s.workers[key]; !ok && shard.Of(key, s.opts.Shards) == k && s.wants(key) {
			s.startLocked(key, owned[key], true)
		}
	}
	for key, entries := range owned {
		if _, ok := s.workers[key]; !ok && shard.Of(key, s.opts.Shards) == k && s.holds(key) {
			s.startLocked(key, entries, true)
		}
	}
}

// LoseShard stops the workers of shard k and returns once they have all
// ended: no flush is attempted and nothing is deregistered (another replica
// takes the shard over). Call it before the shard's lease can pass on.
func (s *Supervisor) LoseShard(k int) {
	s.shardMu.Lock()
	had := s.held[k]
	delete(s.held, k)
	delete(s.fences, k)
	s.shardMu.Unlock()
	s.mu.Lock()
	var stopping []*entry
	for key, e := range s.workers {
		if shard.Of(key, s.opts.Shards) == k {
			e.cancel(worker.ErrHandedOver)
			stopping = append(stopping, e)
		}
	}
	s.mu.Unlock()
	for _, e := range stopping {
		<-e.done
	}
	if had {
		s.opts.Hooks.Shards.ShardLost(k)
		s.log.Info("Shard lost; its workers stopped", "shard", k, "workers", len(stopping))
	}
}

// ReplicaIDConflict counts a renewal of this replica's Lease that another
// process wrote (shard.Fleet).
func (s *Supervisor) ReplicaIDConflict() { s.opts.Hooks.Shards.ReplicaIDConflict() }
