package shard

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The hand-written writes of a shard Lease (takeOver, release) and those of
// client-go's election never overlap in one replica: both kinds run only
// while no election for the shard runs here (electing reports it), and
// elections are started and awaited only by the goroutine that makes the
// hand-written writes (Run's loop; shutdown runs after it, one goroutine per
// shard). See the package doc.

// electing reports whether an election for shard k runs here. A
// hand-written write of its Lease while it does is a bug: it is refused.
func (m *Manager) electing(k int, write string) bool {
	m.electorsMu.Lock()
	_, ok := m.electors[k]
	m.electorsMu.Unlock()
	if ok {
		m.log.Error("BUG: a hand-written shard lease write while its election runs; refused", "shard", k, "write", write)
	}
	return ok
}

// takeOver claims shard k's expired Lease for this replica with an update
// conditional on the version that was seen unchanged for a lease duration
// (what client-go's election does, with the sighting from the watch rather
// than from its own first poll). The old holder stopped its workers by
// then: it gives up RetryPeriod+RenewDeadline after its last renewal.
//
// The Lease must still be the version that expired. The lister's store is
// updated before the watch handler sights a change, and other takeovers run
// between observe and here: a Lease another replica has just taken over is
// already in the store with a new resourceVersion while its sighting is
// still the expired one. Updating that copy would steal a shard its new
// holder is already leading (two replicas syncing it until the loser's
// renew deadline), so such a Lease is left for the next sighting.
func (m *Manager) takeOver(ctx context.Context, k int) bool {
	if m.electing(k, "take over") {
		return false
	}
	name := m.names.shard(k)
	m.seenMu.Lock()
	s, seen := m.seen[name]
	m.seenMu.Unlock()
	if !seen || m.clock.Now().Before(s.at.Add(m.cfg.LeaseDuration)) {
		return false
	}
	l, err := m.leases.Get(name)
	if err != nil || l.ResourceVersion != s.rv || !apiequality.Semantic.DeepEqual(l.Spec, s.spec) {
		return false
	}
	l = l.DeepCopy()
	was := ptr.Deref(l.Spec.HolderIdentity, "")
	now := metav1.NewMicroTime(m.clock.Now())
	l.Spec.HolderIdentity = ptr.To(m.cfg.ReplicaID)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(m.cfg.LeaseDuration / time.Second))
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[labelCluster], l.Labels[labelRole] = m.names.cluster, "shard"
	taken, err := m.api.CoordinationV1().Leases(m.cfg.Namespace).Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		if !apierrors.IsConflict(err) {
			m.log.Warn("Cannot take over an expired shard lease", "shard", k, "holder", was, "error", err)
		}
		return false
	}
	// Sighted now, not when the watch delivers it: until then the next
	// reconcile would still see the old holder, take this replica's new
	// candidacy for a lost race and stop it.
	m.sightOwnWrite(s, taken)
	m.log.Info("Took over a shard whose holder stopped renewing", "shard", k, "holder", was, "lease_duration", m.cfg.LeaseDuration)
	return true
}

// release clears the holder of shard k's Lease if it is still ours, and
// sights the release at once (so the next reconcile does not take the Lease
// for one of ours left without an election and run for it again).
func (m *Manager) release(k int) {
	if m.electing(k, "release") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	api := m.api.CoordinationV1().Leases(m.cfg.Namespace)
	m.seenMu.Lock()
	before := m.seen[m.names.shard(k)]
	m.seenMu.Unlock()
	l, err := api.Get(ctx, m.names.shard(k), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != m.cfg.ReplicaID {
		return
	}
	now := metav1.NewMicroTime(m.clock.Now())
	l.Spec.HolderIdentity = ptr.To("")
	l.Spec.LeaseDurationSeconds = ptr.To(int32(1))
	l.Spec.RenewTime = &now
	released, err := api.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		m.log.Warn("Cannot release the shard lease; it expires on its own", "shard", k, "error", err)
		return
	}
	m.sightOwnWrite(before, released)
}

// renewPresence creates or renews this replica's Lease: an update of the
// watched copy, and a read from the API only when that copy was stale.
func (m *Manager) renewPresence(ctx context.Context) error {
	api := m.api.CoordinationV1().Leases(m.cfg.Namespace)
	now := metav1.NewMicroTime(m.clock.Now())
	m.seenMu.Lock() // noted before the write: its watch event may come first
	m.ownRenews = append(m.ownRenews, now.Time)
	if len(m.ownRenews) > 4 {
		m.ownRenews = m.ownRenews[1:]
	}
	m.seenMu.Unlock()
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.cfg.ReplicaID), RenewTime: &now,
		LeaseDurationSeconds: ptr.To(int32(m.cfg.LeaseDuration / time.Second))}
	l, err := m.leases.Get(m.names.replica())
	for attempt := 0; ; attempt++ {
		if apierrors.IsNotFound(err) {
			spec.AcquireTime = &now
			_, err = api.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: m.names.replica(),
				Labels: map[string]string{labelCluster: m.names.cluster, labelRole: "replica"}}, Spec: spec}, metav1.CreateOptions{})
		} else if err == nil {
			l = l.DeepCopy()
			spec.AcquireTime = l.Spec.AcquireTime
			l.Spec = spec
			_, err = api.Update(ctx, l, metav1.UpdateOptions{})
		}
		if attempt > 0 || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
			return err
		}
		l, err = api.Get(ctx, m.names.replica(), metav1.GetOptions{})
	}
}
