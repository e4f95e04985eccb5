package shard

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Confirm reads the Leases of the shards this replica believes it holds
// from the API server itself (not the watch's cache, which lags behind
// after the process was stopped) and returns those another replica holds
// now, or that are gone. A replica stopped past its Lease (SIGSTOP, a long
// pause) learns this way, before its elections notice, which shards were
// taken while it was away. Those are handed over at the next reconcile, as
// Fenced ones are (their elections stopped, so that one still renewing
// cannot take the Lease back unnoticed once it is released). Confirm
// writes nothing itself; each read is bounded by RenewDeadline. An error:
// not known (no read answered for some shard).
func (m *Manager) Confirm(ctx context.Context, held []int) ([]int, error) {
	leases := make(map[int]*coordinationv1.Lease, len(held))
	for _, k := range held {
		rctx, cancel := context.WithTimeout(ctx, m.cfg.RenewDeadline)
		l, err := m.api.CoordinationV1().Leases(m.cfg.Namespace).Get(rctx, m.names.shard(k), metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			leases[k] = nil
		case err != nil:
			return nil, fmt.Errorf("confirm shard %d: read lease %s/%s: %w", k, m.cfg.Namespace, m.names.shard(k), err)
		default:
			leases[k] = l
		}
	}
	lost := lostShards(m.cfg.ReplicaID, held, leases)
	for _, k := range lost {
		m.Fenced(k)
	}
	return lost, nil
}

// lostShards are the shards of held whose Lease (as read; nil: gone) does
// not name identity as its holder.
func lostShards(identity string, held []int, leases map[int]*coordinationv1.Lease) []int {
	var lost []int
	for _, k := range held {
		if l := leases[k]; l == nil || ptr.Deref(l.Spec.HolderIdentity, "") != identity {
			lost = append(lost, k)
		}
	}
	return lost
}

// confirmAfterPause runs when the retry tick comes late by more than a
// retry period: the process was stopped (SIGSTOP, a VM or GC pause) or
// starved. Its elections may still say they lead shards another replica
// took meanwhile, and would only notice after RenewDeadline; the Leases
// as the API server has them now say at once, and the shards they give
// others are handed over at the next reconcile (Confirm, Fenced), which
// stops their workers first. A read that fails leaves it to the
// elections.
func (m *Manager) confirmAfterPause(ctx context.Context, gap time.Duration) {
	var held []int
	m.electorsMu.Lock()
	for k, e := range m.electors {
		if e.isLeading() {
			held = append(held, k)
		}
	}
	m.electorsMu.Unlock()
	if len(held) == 0 {
		return
	}
	lost, err := m.Confirm(ctx, held)
	if err != nil {
		m.log.Warn("Cannot confirm the shards held after a pause; the elections decide", "gap", gap, "error", err)
		return
	}
	if len(lost) > 0 {
		m.log.Warn("Shards taken by another replica while this one was stopped; handing them over", "gap", gap, "shards", lost)
	}
}
