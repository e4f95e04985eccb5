package supervisor

import (
	"context"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/backoff"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/shard"
)

// Fencing gives every shard this replica gains a fencing token in Consul
// (package consul/fence), carried by every transaction of the shard's
// workers, so that a replica that froze past its Lease cannot commit a
// write for a shard another replica took meanwhile.
type Fencing struct {
	// Take takes shard k's token as this replica gains the shard (before
	// any of its workers starts); nil: no fencing (one shard, tests).
	Take func(ctx context.Context, shard int) (consul.Guard, error)
	// Fenced, when set, is told that a write of shard k was refused on its
	// token, after the shard's workers stopped: the shard manager gives
	// the shard up (shard.Manager.Fenced).
	Fenced func(shard int)
}

// fenceBackoff paces GainShard's attempts to take a fence while Consul
// does not answer.
var fenceBackoff = backoff.Policy{Min: 500 * time.Millisecond, Max: 10 * time.Second, Jitter: 0.2}

// takeFence takes shard k's token, retrying until it is taken (ok) or ctx
// ends. Without fencing it returns nil, true.
func (s *Supervisor) takeFence(ctx context.Context, k int) (g consul.Guard, ok bool) {
	if s.opts.Fencing.Take == nil {
		return nil, true
	}
	for n := 1; ; n++ {
		g, err := s.opts.Fencing.Take(ctx, k)
		if err == nil {
			return g, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		wait := fenceBackoff.Delay(n)
		s.log.Warn("Cannot take the shard's fence in Consul; retrying", "shard", k, "retry_in", wait, "error", err)
		t := s.opts.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false
		case <-t.C():
		}
	}
}

// fenceOf is the token of key's shard for its worker: nil without
// fencing; one that refuses every write when the shard is not held (a
// worker restarted after its shard went). It takes shardMu, never mu.
func (s *Supervisor) fenceOf(key k8s.Key) consul.Guard {
	if s.opts.Shards <= 1 || s.opts.Fencing.Take == nil {
		return nil
	}
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	if g, ok := s.fences[shard.Of(key, s.opts.Shards)]; ok {
		return g
	}
	return notHeld{}
}

// fenced handles a worker that ended with worker.ErrFenced (runWorker,
// before e.done closes): the first of its shard's token stops the
// shard's other workers and tells Fencing.Fenced; the others only leave.
func (s *Supervisor) fenced(key k8s.Key, e *entry) {
	s.stopped(key, e)
	k := shard.Of(key, s.opts.Shards)
	s.shardMu.Lock()
	first := s.held[k] && s.fences[k] == e.w.Fence()
	if first {
		delete(s.fences, k) // workers started from now on refuse to write
	}
	s.shardMu.Unlock()
	if !first {
		return
	}
	s.log.Warn("Shard fenced: another replica took it while this one could not see it; its workers stop without retrying", "shard", k,
		"namespace", key.Namespace, "service", key.Name)
	s.wg.Add(1) // runWorker's count is still held: Run's Wait has not returned
	go func() {
		defer s.wg.Done()
		s.LoseShard(k)
		if s.opts.Fencing.Fenced != nil {
			s.opts.Fencing.Fenced(k)
		}
	}()
}

// notHeld is the fence of a shard this replica does not hold: it refuses.
type notHeld struct{}

func (notHeld) Ops() (api.TxnOps, error) {
	return nil, &consul.TxnError{Fenced: consul.ErrFenced.Error() + ": the shard is not held by this replica"}
}

func (notHeld) Failed(context.Context) error { return nil }

func newFenced(f promauto.Factory) prometheus.Counter {
	return f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_shard_fenced_total",
		Help: "Transactions Consul refused on their shard's fencing token because another replica had taken the shard (this one froze past its Lease): the shard's workers stopped and the write was not retried."})
}

// ShardFenced counts a transaction refused on shard k's fence (give it
// to consul/fence as its OnFenced).
func (m *Metrics) ShardFenced(int) { m.fenced.Inc() }
