package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Fleet is what the Manager asks of the supervisor: every call it makes.
type Fleet interface {
	// BootstrapDone is closed (by the Fleet) once the fleet has read its
	// state; the Manager writes no Lease and runs for no shard before.
	BootstrapDone() <-chan struct{}
	// GainShard makes this replica sync shard k. It is called on the
	// shard's election goroutine once the election leads, with a context
	// that ends when leading ends; it may block (reading the owned state)
	// and returns early only if ctx ends.
	GainShard(ctx context.Context, k int)
	// LoseShard stops shard k's workers and returns once they have all
	// ended; the Manager calls it before the shard's Lease can pass on
	// (before a release, and when the election stops leading). It is a
	// no-op for a shard not held.
	LoseShard(k int)
	// ReplicaIDConflict counts a renewal of this replica's Lease that
	// another process wrote (two processes with one --replica-id). It must
	// not block: it is called on the Lease watch's goroutine.
	ReplicaIDConflict()
}

// Deps are what a Manager runs with besides its Config.
type Deps struct {
	Client    kubernetes.Interface
	ClusterID string
	Fleet     Fleet
	Log       hclog.Logger // default: none
	// Clock drives every timer and timestamp of the Manager (default the
	// real clock). client-go's election keeps its own real-time timers.
	Clock clock.Clock
}

// Manager holds at most ceil(shards / live replicas) shard Leases for one
// replica and tells the Fleet which shards are its own (see the package
// doc).
type Manager struct {
	cfg   Config
	names names
	api   kubernetes.Interface
	fleet Fleet
	log   hclog.Logger
	clock clock.Clock

	electorsMu sync.Mutex
	electors   map[int]*elector // the elections running here

	leases coordinationlisters.LeaseNamespaceLister
	wake   chan struct{} // a holder changed: reconcile now
	fatal  chan error    // the watch cannot work (RBAC): Run returns it
	ready  atomic.Pointer[string]

	seenMu sync.Mutex
	seen   map[string]sighting // Lease name -> its last change seen here
	// Renew times this replica wrote to its replica Lease (the last few),
	// and renewals it did not write, under seenMu: another process with the
	// same --replica-id.
	ownRenews   []time.Time
	foreign     int
	foreignLogs time.Time

	// fenced holds the shards whose writes were refused on their fence
	// (Fenced), to hand over at the next reconcile.
	fencedMu sync.Mutex
	fenced   map[int]bool

	// 403s of the Lease watch and of the replica Lease's writes: see
	// forbids.
	watchForbids, writeForbids forbids
}

// forbids decides whether a 403 ends Run. Before the path was ever
// answered, at once: this replica lacks the RBAC. Once it worked, only when
// the 403s have lasted a lease duration: a restarted kube-apiserver serves
// requests before its RBAC cache has synced and answers them 403 meanwhile
// (kubernetes/kubernetes#121635; the test stack's answers one per restart),
// and the Lease watch's Patient retries reach it within that window.
type forbids struct {
	mu     sync.Mutex
	worked bool
	since  time.Time // first 403 since the last answer; zero: none
}

// answered records a success of the path.
func (f *forbids) answered() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.worked, f.since = true, time.Time{}
}

// fatal records a 403 at now and reports whether it ends Run.
func (f *forbids) fatal(now time.Time, grace time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.worked {
		return true
	}
	if f.since.IsZero() {
		f.since = now
	}
	return now.Sub(f.since) >= grace
}

// New returns a Manager; cfg must be sharded (Shards of at least 2) with
// its Namespace and ReplicaID set.
func New(cfg Config, d Deps) (*Manager, error) {
	if err := cfg.validateManager(); err != nil {
		return nil, err
	}
	if d.Client == nil || d.Fleet == nil || d.ClusterID == "" {
		return nil, errors.New("shard manager: a Kubernetes client, a fleet and a cluster id are needed")
	}
	return newManager(cfg, d), nil
}

func newManager(cfg Config, d Deps) *Manager {
	if d.Log == nil {
		d.Log = hclog.NewNullLogger()
	}
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	m := &Manager{cfg: cfg, names: names{cluster: d.ClusterID, identity: cfg.ReplicaID}, api: d.Client, fleet: d.Fleet,
		log: d.Log, clock: d.Clock, electors: map[int]*elector{},
		wake: make(chan struct{}, 1), fatal: make(chan error, 1), seen: map[string]sighting{}, fenced: map[int]bool{}}
	m.setReady("shards: waiting for the fleet's bootstrap and the Lease watch")
	return m
}

// Ready reports whether the Manager has done its first reconcile (the
// Lease watch synced, the replica Lease written, the first shards run
// for) and, if not, why.
func (m *Manager) Ready() (bool, string) {
	if why := m.ready.Load(); why != nil {
		return false, *why
	}
	return true, ""
}

func (m *Manager) setReady(why string) {
	if why == "" {
		m.ready.Store(nil)
	} else {
		m.ready.Store(&why)
	}
}

// Run takes part in shard ownership until ctx is done. It starts once the
// fleet is bootstrapped; on the way out it deletes its replica Lease, then
// stops the workers of every shard it holds and releases their Leases (so a
// rolling update hands shards over at once). It returns an error when it
// cannot work: the Leases cannot be watched or this replica's Lease cannot
// be written (RBAC), and nil once ctx is done.
func (m *Manager) Run(ctx context.Context) error {
	stop, err := m.watch(ctx)
	defer stop()
	if err != nil || ctx.Err() != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-m.fatal:
		return err
	case <-m.fleet.BootstrapDone():
	}
	retry := m.clock.NewTimer(m.cfg.RetryPeriod)
	defer retry.Stop()
	expiry := m.clock.NewTimer(time.Hour)
	defer expiry.Stop()
	renew := true
	lastTick := m.clock.Now()
	for {
		next, err := m.reconcile(ctx, renew)
		if err != nil {
			m.shutdown()
			return err
		}
		expiry.Stop()
		if !next.IsZero() {
			expiry.Reset(max(next.Sub(m.clock.Now()), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			m.shutdown()
			return nil
		case err := <-m.fatal:
			m.shutdown()
			return err
		case <-retry.C():
			retry.Reset(m.cfg.RetryPeriod)
			renew = true
			now := m.clock.Now()
			if now.Sub(lastTick) > 2*m.cfg.RetryPeriod {
				m.confirmAfterPause(ctx, now.Sub(lastTick))
			}
			lastTick = now
		case <-m.wake:
			renew = false
		case <-expiry.C():
			renew = false
		}
	}
}

// reconcile is one step: renew our replica Lease (on the retry tick),
// delete replica Leases left by crashes, then carry out Decide's plan. It
// returns when the next held-elsewhere Lease expires (zero: none), and an
// error only when this replica may not write its own Lease (forbids).
func (m *Manager) reconcile(ctx context.Context, renew bool) (time.Time, error) {
	if renew {
		if err := m.renewPresence(ctx); err != nil {
			if apierrors.IsForbidden(err) && m.writeForbids.fatal(m.clock.Now(), m.cfg.LeaseDuration) {
				return time.Time{}, fmt.Errorf("write the replica Lease %s/%s: %w", m.cfg.Namespace, m.names.replica(), err)
			}
			m.log.Warn("Cannot renew the replica lease", "error", err)
			return time.Time{}, nil
		}
		m.writeForbids.answered()
	}
	for _, k := range m.takeFenced() {
		m.log.Warn("Handing over a fenced shard: another replica took it while this one could not renew", "shard", k)
		m.handOver(k)
	}
	v := m.observe()
	if renew {
		m.deleteGone(ctx, v.gone)
	}
	s := Situation{Now: v.now, Identity: m.cfg.ReplicaID, Shards: m.cfg.Shards, Live: v.live,
		Holders: v.holders, Until: v.until, Candidates: map[int]bool{}}
	m.electorsMu.Lock()
	for k, e := range m.electors {
		if e.isLeading() {
			s.Leading = append(s.Leading, k)
		} else {
			s.Candidates[k] = e.acquired(m.cfg.ReplicaID)
		}
	}
	m.electorsMu.Unlock()
	p := Decide(s)
	for _, k := range p.HandOver {
		m.log.Info("Handing a shard over to rebalance", "shard", k, "quota", p.Quota, "live_replicas", v.live)
		m.handOver(k)
	}
	for _, k := range p.Withdraw {
		m.stopElector(k)
	}
	for _, k := range p.Resume {
		m.log.Info("Resuming a shard whose Lease names this replica", "shard", k)
		m.startElector(ctx, k)
	}
	for _, k := range p.Release {
		m.release(k)
	}
	for _, k := range p.Run {
		m.startElector(ctx, k)
	}
	taken := 0
	for _, k := range p.TakeOver {
		if taken == p.TakeOverSlots {
			break
		}
		if m.takeOver(ctx, k) {
			m.startElector(ctx, k)
			taken++
		}
	}
	m.setReady("")
	return p.Next, nil
}

// observe reads the watched Leases.
func (m *Manager) observe() view {
	list, err := m.leases.List(labels.Everything())
	if err != nil { // a lister reads memory; it does not fail
		m.log.Warn("Cannot list leases", "error", err)
	}
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	return see(list, m.seen, m.clock.Now(), m.names, m.cfg)
}

// deleteGone deletes replica Leases left by replicas gone for good.
func (m *Manager) deleteGone(ctx context.Context, gone []*coordinationv1.Lease) {
	for _, l := range gone {
		err := m.api.CoordinationV1().Leases(m.cfg.Namespace).Delete(ctx, l.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
		if err == nil {
			m.log.Info("Deleted the replica lease of a replica gone for good", "lease", l.Name, "holder", ptr.Deref(l.Spec.HolderIdentity, ""))
		} else if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			m.log.Warn("Cannot delete a stale replica lease", "lease", l.Name, "error", err)
		}
	}
}

// shutdown deletes the replica Lease first (so the others raise their quota
// at once), then hands every held shard over, all at the same time.
func (m *Manager) shutdown() {
	m.setReady("shards: stopping")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.api.CoordinationV1().Leases(m.cfg.Namespace).Delete(ctx, m.names.replica(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		m.log.Warn("Cannot delete the replica lease", "error", err)
	}
	m.electorsMu.Lock()
	ks := make([]int, 0, len(m.electors))
	for k := range m.electors {
		ks = append(ks, k)
	}
	m.electorsMu.Unlock()
	var wg sync.WaitGroup
	for _, k := range ks {
		wg.Go(func() { m.handOver(k) })
	}
	wg.Wait()
}

// Fenced tells the Manager that a write of shard k was refused on the
// shard's fence in Consul: another replica took the shard while this one
// could not see it (frozen past its Lease). The next reconcile hands the
// shard over (Fleet.LoseShard, the election stopped, the Lease released
// if it still names this replica); Decide may run for it again later,
// like for any free shard. It does not block.
func (m *Manager) Fenced(k int) {
	m.fencedMu.Lock()
	m.fenced[k] = true
	m.fencedMu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// takeFenced returns the shards Fenced named since the last call.
func (m *Manager) takeFenced() []int {
	m.fencedMu.Lock()
	defer m.fencedMu.Unlock()
	out := make([]int, 0, len(m.fenced))
	for k := range m.fenced {
		out = append(out, k)
	}
	clear(m.fenced)
	return out
}
