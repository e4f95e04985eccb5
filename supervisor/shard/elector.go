package shard

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// elector is one client-go leader election for one shard Lease: while it
// runs, it is the only writer of that Lease in this replica.
type elector struct {
	le      *leaderelection.LeaderElector
	cancel  context.CancelFunc
	done    chan struct{} // closed once the election ended and left electors
	mu      sync.Mutex
	leading bool
	stopped bool
}

// acquired: the election itself has read the Lease naming this replica (it
// leads, or is about to call OnStartedLeading).
func (e *elector) acquired(identity string) bool {
	return e.le != nil && e.le.GetLeader() == identity
}

func (e *elector) isLeading() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

// startElector runs client-go leader election for shard k. Leading gains
// the shard; losing the lease (renewals failing for RenewDeadline) loses it,
// stopping its workers before the lease can expire for others.
func (m *Manager) startElector(ctx context.Context, k int) {
	e := &elector{done: make(chan struct{})}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: m.names.shard(k), Namespace: m.cfg.Namespace},
		Client:     m.api.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: m.cfg.ReplicaID},
		Labels:     map[string]string{labelCluster: m.names.cluster, labelRole: "shard"},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: m.cfg.LeaseDuration, RenewDeadline: m.cfg.RenewDeadline, RetryPeriod: m.cfg.RetryPeriod,
		// Released by hand, after the shard's workers stopped (client-go
		// would release before calling OnStoppedLeading).
		ReleaseOnCancel: false,
		Name:            m.names.shard(k),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				e.mu.Lock()
				if e.stopped {
					e.mu.Unlock()
					return
				}
				e.leading = true
				e.mu.Unlock()
				m.fleet.GainShard(lctx, k)
			},
			OnStoppedLeading: func() {
				e.mu.Lock()
				was := e.leading
				e.leading, e.stopped = false, true
				e.mu.Unlock()
				if was {
					m.fleet.LoseShard(k)
				}
			},
		},
	})
	if err != nil {
		m.log.Error("Cannot build the shard elector", "shard", k, "error", err)
		return
	}
	e.le = le
	// Only handOver and stopElector end an election: at shutdown the
	// workers stop first, then the Lease is released (shutdown).
	ectx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancel = cancel
	m.electorsMu.Lock()
	m.electors[k] = e
	m.electorsMu.Unlock()
	go func() {
		defer close(e.done)
		le.Run(ectx)
		m.electorsMu.Lock()
		if m.electors[k] == e {
			delete(m.electors, k)
		}
		m.electorsMu.Unlock()
	}()
}

// handOver gives shard k up: its workers stop first, then its election
// ends, then the Lease is released, so another replica can take it within a
// retry period.
func (m *Manager) handOver(k int) {
	m.fleet.LoseShard(k)
	m.stopElector(k)
	m.release(k)
}

// stopElector ends shard k's election, if one runs, and waits until it has
// ended (it writes the Lease no more).
func (m *Manager) stopElector(k int) {
	m.electorsMu.Lock()
	e, ok := m.electors[k]
	m.electorsMu.Unlock()
	if !ok {
		return
	}
	e.cancel()
	<-e.done
}
