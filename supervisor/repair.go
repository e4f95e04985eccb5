package supervisor

import (
	"context"
	"strings"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/loss"
	"github.com/fleetsync/fleetsync/worker"
)

// newLossWatch builds the loss detection (package loss) that Run runs
// until its context is done: a loss makes every worker re-read and repair
// its Service now instead of within its anti-entropy period; a look-alike
// node (someone else's, with our name) is reported and makes the fleet
// unready; Consul answering again ends the workers' backoffs.
func (s *Supervisor) newLossWatch() *loss.Watch {
	reported := map[string]bool{} // foreign nodes logged; the watch's goroutine only
	var confirm func(context.Context) error
	if s.opts.Shards > 1 && s.opts.ConfirmShards != nil {
		confirm = s.confirmShards
	}
	return loss.New(loss.Config{
		Store:    s.opts.Store,
		Clock:    s.opts.Clock,
		Log:      s.log,
		Interval: s.opts.NodeCheckInterval,
		StateKey: s.opts.StateKey,
		Guard:    func(check func() error) error { return s.recoverRead(readNodeCheck, check) },
		Lost:     s.dataLost,
		Foreign:  func(nodes []consul.NodeEntry) { s.foreignNodes(nodes, reported) },
		Confirm:  confirm,
		Answering: func() {
			// A worker whose flush failed while Consul was away retries
			// now, not at the end of its backoff.
			n := s.retryAll()
			s.log.Info("Consul answers again; workers backing off retry now", "workers", n)
		},
	})
}

// confirmShards is the loss check's Confirm: a replica stopped past its
// shard Leases (SIGSTOP, a long pause) may find entries it witnessed
// rewritten by the replica that took a shard meanwhile, before its
// elections notice the shard is gone. The Leases say which shards are
// another replica's now: their workers stop here (LoseShard, which forgets
// their witnesses) before any entry is judged lost, and the shard manager
// hands them over (ConfirmShards).
func (s *Supervisor) confirmShards(ctx context.Context) error {
	lost, err := s.opts.ConfirmShards(ctx, s.HeldShards())
	if err != nil {
		return err
	}
	for _, k := range lost {
		s.log.Warn("Shard held by another replica now (this one was stopped past its lease); its workers stop", "shard", k)
		s.LoseShard(k)
	}
	return nil
}

// lossSeen is the report of key's worker that Consul lost entries it
// wrote; it stands while this replica holds key's shard (see
// confirmShards).
func (s *Supervisor) lossSeen(key k8s.Key, reason string) {
	if w := s.loss.Load(); w != nil {
		w.Report(reason, func() bool { return s.holds(key) })
	}
}

// dataLost is the one way the supervisor hears of a loss: every worker
// repairs its Service (repairAll).
func (s *Supervisor) dataLost(ctx context.Context, found []loss.Finding) {
	n := s.repairAll(ctx)
	details := make([]string, 0, len(found))
	for _, f := range found {
		s.opts.Hooks.Consul.ConsulDataLost(f.Signal)
		details = append(details, f.Detail)
	}
	s.log.Warn("Consul lost or rolled back data; every worker re-reads its Service and repairs it now", "workers", n, "evidence", strings.Join(details, "; "))
}

// repairAll makes every worker repair its Service from one read of every
// node of the cluster (worker.Adopt), and starts a worker for each Service
// that has entries there and none running (its Service deleted or
// deselected since: a restore brought its entries back); it returns the
// number of workers told. When the read fails, each worker re-reads its
// own instead (worker.Resync).
func (s *Supervisor) repairAll(ctx context.Context) int {
	start := s.opts.Clock.Now()
	var entries []consul.Registered
	err := s.recoverRead(readRepair, func() (err error) {
		entries, err = s.opts.Store.ReadNode(ctx)
		return err
	})
	if err != nil {
		s.log.Warn("Cannot read the cluster's nodes after a loss; every worker reads its own", "error", err)
		return s.resyncAll()
	}
	owned, _ := worker.HoldOwned(s.opts.Worker.Cluster, entries)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for key, e := range s.workers {
		e.w.Adopt(owned[key], start)
		n++
	}
	for key := range owned {
		if _, ok := s.workers[key]; !ok && s.ctx.Err() == nil && s.holds(key) {
			// It reads its entries itself: the read above may predate a
			// worker of the same Service that finished meanwhile.
			if w := s.startLocked(key, nil, false); w != nil {
				n++
			}
		}
	}
	return n
}
