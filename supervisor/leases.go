package supervisor

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
)

// ShardConfig configures the shard leases of one replica.
type ShardConfig struct {
	Client    kubernetes.Interface
	Namespace string // of the Leases
	ClusterID string
	Identity  string // this replica (a DNS subdomain name: the pod name)
	Shards    int
	// Lease timing (client-go leader election): a holder that cannot renew
	// for RenewDeadline gives the shard up (its workers stop) at the latest
	// RetryPeriod+RenewDeadline after its last renewal; nobody takes a shard
	// before its Lease went unchanged for LeaseDuration.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       hclog.Logger
	// Now is the clock of lease observations (default time.Now).
	Now func() time.Time
}

// Validate checks the timing.
func (c ShardConfig) Validate() error {
	if c.Shards < 2 {
		return errors.New("shard leases need --shards of at least 2")
	}
	if err := ValidateLeaseTiming(c.LeaseDuration, c.RenewDeadline, c.RetryPeriod); err != nil {
		return err
	}
	if c.Identity == "" || c.Namespace == "" {
		return errors.New("shard leases need a replica id and a lease namespace")
	}
	return nil
}

// ValidateLeaseTiming checks 0 < retry < renew deadline and renew deadline
// + retry < lease duration: a holder cut off from the API server stops its
// workers RetryPeriod+RenewDeadline after its last renewal at the latest,
// which must come before anyone can take the shard (LeaseDuration after the
// last renewal was seen).
func ValidateLeaseTiming(lease, renew, retry time.Duration) error {
	if !(retry > 0 && retry < renew && renew+retry < lease) {
		return fmt.Errorf("lease timing: need 0 < retry period (%s) < renew deadline (%s) and renew deadline + retry period < lease duration (%s)",
			retry, renew, lease)
	}
	return nil
}

// Lease labels and names.
const (
	labelCluster = "fleetsync.io/cluster"
	labelRole    = "fleetsync.io/role"
)

func (c ShardConfig) shardLease(k int) string {
	return fmt.Sprintf("fleetsync-%s-shard-%d", c.ClusterID, k)
}
func (c ShardConfig) replicaLease() string {
	return fmt.Sprintf("fleetsync-%s-replica-%s", c.ClusterID, c.Identity)
}

// ShardManager holds at most ceil(shards / live replicas) shard Leases for
// one replica and tells the supervisor which shards are its own. Kubernetes
// Leases are the only coordination: a Lease per replica tells who is alive,
// a Lease per shard who syncs it (client-go leader election). All Leases of
// the cluster are watched, so a released shard is taken at once and a dead
// holder's shard one lease duration after its last renewal was seen.
type ShardManager struct {
	cfg ShardConfig
	sup *Supervisor
	log hclog.Logger

	mu       sync.Mutex
	electors map[int]*elector

	leases coordinationlisters.LeaseNamespaceLister
	wake   chan struct{}
	seenMu sync.Mutex
	seen   map[string]sighting // Lease name -> its last change seen here

	// Renew times this replica wrote to its replica Lease (the last few),
	// and renewals it did not write, under seenMu: another process with the
	// same --replica-id.
	ownRenews   []time.Time
	foreign     int
	foreignLogs time.Time
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

type elector struct {
	le      *leaderelection.LeaderElector
	cancel  context.CancelFunc
	done    chan struct{}
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

// NewShardManager returns a manager for sup, whose Options.Shards must equal
// cfg.Shards.
func NewShardManager(cfg ShardConfig, sup *Supervisor) *ShardManager {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &ShardManager{cfg: cfg, sup: sup, log: cfg.Log, electors: map[int]*elector{},
		wake: make(chan struct{}, 1), seen: map[string]sighting{}}
}

// Run takes part in shard ownership until ctx is done. It starts once the
// supervisor is bootstrapped; on the way out it stops the workers of every
// shard it holds, then releases the shard Leases (so a rolling update hands
// shards over at once) and deletes its replica Lease.
func (m *ShardManager) Run(ctx context.Context) {
	stop, ok := m.watch(ctx)
	defer stop()
	if !ok {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-m.sup.BootstrapDone():
	}
	tick := time.NewTicker(m.cfg.RetryPeriod)
	defer tick.Stop()
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	renew := true
	for {
		next := m.reconcile(ctx, renew)
		expiry.Stop()
		if !next.IsZero() {
			expiry.Reset(max(next.Sub(m.cfg.Now()), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			m.shutdown()
			return
		case <-tick.C:
			renew = true
		case <-m.wake:
			renew = false
		case <-expiry.C:
			renew = false
		}
	}
}

// watch starts an informer on this cluster's Leases and waits for its
// first list. Every change is sighted; a change of holder (a shard
// released or taken, a replica come or gone) wakes the loop at once. stop
// ends the watch and waits for its goroutines.
func (m *ShardManager) watch(ctx context.Context) (stop func(), ok bool) {
	f := informers.NewSharedInformerFactoryWithOptions(m.cfg.Client, 0, informers.WithNamespace(m.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelCluster + "=" + m.cfg.ClusterID }))
	inf := f.Coordination().V1().Leases()
	reg, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    m.sight,
		UpdateFunc: func(_, obj any) { m.sight(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if l, ok := obj.(*coordinationv1.Lease); ok {
				m.seenMu.Lock()
				delete(m.seen, l.Name)
				m.seenMu.Unlock()
				m.poke()
			}
		},
	})
	if err != nil {
		m.log.Error("Cannot watch the leases", "error", err)
		return func() {}, false
	}
	m.leases = inf.Lister().Leases(m.cfg.Namespace)
	wctx, cancel := context.WithCancel(ctx)
	f.Start(wctx.Done())
	stop = func() { cancel(); f.Shutdown() }
	// The handler's own sync: every Lease of the first list sighted (the
	// informer's store can be synced before its handlers have seen it).
	if !cache.WaitForCacheSync(wctx.Done(), reg.HasSynced) {
		m.log.Warn("Lease watch did not sync")
		return stop, false
	}
	return stop, true
}

func (m *ShardManager) sight(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	m.seenMu.Lock()
	old, had := m.seen[l.Name]
	if !had || old.rv != l.ResourceVersion || !apiequality.Semantic.DeepEqual(old.spec, l.Spec) {
		m.seen[l.Name] = newSighting(l, m.cfg.Now(), !had)
		if l.Name == m.cfg.replicaLease() && holder == m.cfg.Identity {
			m.checkOwnRenewal(l.Spec.RenewTime)
		}
	}
	m.seenMu.Unlock()
	if !had || old.holder != holder {
		m.poke()
	}
}

func (m *ShardManager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// reconcile is one step: renew our replica Lease (on the retry tick),
// compute the quota, shed extra shards, drop hopeless candidacies, run for
// free shards and take over shards whose holder stopped renewing. It
// returns when the next held-elsewhere Lease expires (zero: none).
func (m *ShardManager) reconcile(ctx context.Context, renew bool) time.Time {
	if renew {
		if err := m.renewPresence(ctx); err != nil {
			m.log.Warn("Cannot renew the replica lease", "error", err)
			return time.Time{}
		}
	}
	v := m.observe()
	if renew {
		for _, l := range v.gone {
			err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Delete(ctx, l.Name,
				metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
			if err == nil {
				m.log.Info("Deleted the replica lease of a replica gone for good", "lease", l.Name, "holder", ptr.Deref(l.Spec.HolderIdentity, ""))
			} else if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				m.log.Warn("Cannot delete a stale replica lease", "lease", l.Name, "error", err)
			}
		}
	}
	quota := (m.cfg.Shards + v.live - 1) / v.live
	m.mu.Lock()
	var leading []int
	candidates := map[int]*elector{}
	for k, e := range m.electors {
		if e.isLeading() {
			leading = append(leading, k)
		} else {
			candidates[k] = e
		}
	}
	m.mu.Unlock()
	m.sortByRank(leading)
	shed := map[int]bool{}
	for len(leading) > quota { // shed the shards we like least
		k := leading[len(leading)-1]
		leading = leading[:len(leading)-1]
		m.log.Info("Handing a shard over to rebalance", "shard", k, "quota", quota, "live_replicas", v.live)
		m.handOver(k)
		shed[k] = true
	}
	for k, e := range candidates {
		// Someone else got it first, as far as the watch has seen; a
		// candidacy whose own read found this replica holding it is kept
		// (the watch may not have delivered the change yet).
		if h := v.holders[k]; h != "" && h != m.cfg.Identity && !e.acquired(m.cfg.Identity) {
			m.stopElector(k)
		}
	}
	m.mu.Lock()
	running := len(m.electors)
	m.mu.Unlock()
	var ours, free, expired []int
	var next time.Time
	for k := 0; k < m.cfg.Shards; k++ {
		m.mu.Lock()
		_, mine := m.electors[k]
		m.mu.Unlock()
		switch h, until := v.holders[k], v.until[k]; {
		case mine, shed[k]:
		case h == m.cfg.Identity:
			// A Lease naming this replica with no election running here: an
			// earlier process of this replica (a container restarted in its
			// pod keeps the pod name) or a candidacy stopped on news the
			// watch had not caught up with. Nobody renews it, and nobody
			// else may take it for a lease duration.
			ours = append(ours, k)
		case h == "":
			free = append(free, k)
		case !until.After(v.now):
			expired = append(expired, k)
		case next.IsZero() || until.Before(next):
			next = until
		}
	}
	// Resume those within the quota (the election leads at once: the Lease
	// already names this replica) and release the rest for the others.
	m.sortByRank(ours)
	for _, k := range ours {
		if running < quota {
			m.log.Info("Resuming a shard whose Lease names this replica", "shard", k)
			m.startElector(ctx, k)
			running++
		} else {
			m.release(k)
		}
	}
	m.sortByRank(free)
	for i := 0; i < len(free) && running < quota; i++ {
		m.startElector(ctx, free[i])
		running++
	}
	m.sortByRank(expired)
	for i := 0; i < len(expired) && running < quota; i++ {
		if m.takeOver(ctx, expired[i]) {
			m.startElector(ctx, expired[i])
			running++
		}
	}
	return next
}

// sortByRank orders shards by this replica's preference (rendezvous
// hashing), so that replicas prefer different shards.
func (m *ShardManager) sortByRank(ks []int) {
	rank := func(k int) uint32 {
		h := fnv.New32a()
		_, _ = h.Write([]byte(m.cfg.Identity + "/" + strconv.Itoa(k)))
		return h.Sum32()
	}
	sort.Slice(ks, func(i, j int) bool { return rank(ks[i]) > rank(ks[j]) })
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

// observe reads the watched Leases. A replica is live while its Lease was
// seen to change within two retry periods and a second; a held shard
// expires one lease duration after its Lease was last seen to change.
func (m *ShardManager) observe() view {
	v := view{now: m.cfg.Now(), holders: map[int]string{}, until: map[int]time.Time{}}
	list, err := m.leases.List(labels.Everything())
	if err != nil { // a lister reads memory; it does not fail
		m.log.Warn("Cannot list leases", "error", err)
	}
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	shardPrefix := fmt.Sprintf("fleetsync-%s-shard-", m.cfg.ClusterID)
	for _, l := range list {
		s, ok := m.seen[l.Name]
		if !ok {
			continue
		}
		switch {
		case l.Labels[labelRole] == "replica":
			switch {
			case s.holder == m.cfg.Identity:
			case s.holder != "" && v.now.Sub(s.changed()) < 2*m.cfg.RetryPeriod+time.Second:
				v.live++
			case v.now.Sub(s.at) >= replicaLeaseGC*m.cfg.LeaseDuration:
				v.gone = append(v.gone, l)
			}
		case strings.HasPrefix(l.Name, shardPrefix):
			k, err := strconv.Atoi(strings.TrimPrefix(l.Name, shardPrefix))
			if err == nil && k >= 0 && k < m.cfg.Shards && s.holder != "" {
				v.holders[k] = s.holder
				v.until[k] = s.at.Add(m.cfg.LeaseDuration)
			}
		}
	}
	v.live++ // this replica
	return v
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
func (m *ShardManager) takeOver(ctx context.Context, k int) bool {
	name := m.cfg.shardLease(k)
	m.seenMu.Lock()
	s, seen := m.seen[name]
	m.seenMu.Unlock()
	if !seen || m.cfg.Now().Before(s.at.Add(m.cfg.LeaseDuration)) {
		return false
	}
	l, err := m.leases.Get(name)
	if err != nil || l.ResourceVersion != s.rv || !apiequality.Semantic.DeepEqual(l.Spec, s.spec) {
		return false
	}
	l = l.DeepCopy()
	was := ptr.Deref(l.Spec.HolderIdentity, "")
	now := metav1.NewMicroTime(m.cfg.Now())
	l.Spec.HolderIdentity = ptr.To(m.cfg.Identity)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(m.cfg.LeaseDuration / time.Second))
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[labelCluster], l.Labels[labelRole] = m.cfg.ClusterID, "shard"
	taken, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Update(ctx, l, metav1.UpdateOptions{})
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

// sightOwnWrite records a Lease this replica has just written, unless the
// watch has already sighted a change since before (the sighting that was
// current before the write).
func (m *ShardManager) sightOwnWrite(before sighting, l *coordinationv1.Lease) {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	if cur := m.seen[l.Name]; cur.rv == before.rv && apiequality.Semantic.DeepEqual(cur.spec, before.spec) {
		m.seen[l.Name] = newSighting(l, m.cfg.Now(), false)
	}
}

// checkOwnRenewal notes a change of this replica's Lease that names it:
// one of its own renewals, or, once it has renewed at least once, another
// process's with the same --replica-id. That one would hold the same shards
// (each takes a shard Lease naming its identity for its own), so it is
// counted and, from the second one on, logged as an error at most once a
// lease duration. (The first is not logged: an update whose answer was
// lost looks the same once.) Called with seenMu held.
func (m *ShardManager) checkOwnRenewal(renewed *metav1.MicroTime) {
	if renewed == nil || len(m.ownRenews) == 0 {
		return // before the first renewal: the Lease an earlier process left
	}
	for _, t := range m.ownRenews {
		if t.Truncate(time.Microsecond).Equal(renewed.Time.Truncate(time.Microsecond)) {
			return
		}
	}
	m.foreign++
	m.sup.opts.Hooks.ReplicaIDConflict()
	if now := m.cfg.Now(); m.foreign >= 2 && now.Sub(m.foreignLogs) >= m.cfg.LeaseDuration {
		m.foreignLogs = now
		m.log.Error("Another process renews this replica's Lease: --replica-id must be unique (the default, the pod name, is); both processes hold the same shards",
			"replica", m.cfg.Identity, "lease", m.cfg.replicaLease(), "foreign_renewals", m.foreign)
	}
}

// renewPresence creates or renews this replica's Lease: an update of the
// watched copy, and a read from the API only when that copy was stale.
func (m *ShardManager) renewPresence(ctx context.Context) error {
	api := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace)
	now := metav1.NewMicroTime(m.cfg.Now())
	m.seenMu.Lock() // noted before the write: its watch event may come first
	m.ownRenews = append(m.ownRenews, now.Time)
	if len(m.ownRenews) > 4 {
		m.ownRenews = m.ownRenews[1:]
	}
	m.seenMu.Unlock()
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.cfg.Identity), RenewTime: &now,
		LeaseDurationSeconds: ptr.To(int32(m.cfg.LeaseDuration / time.Second))}
	l, err := m.leases.Get(m.cfg.replicaLease())
	for attempt := 0; ; attempt++ {
		if apierrors.IsNotFound(err) {
			spec.AcquireTime = &now
			_, err = api.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: m.cfg.replicaLease(),
				Labels: map[string]string{labelCluster: m.cfg.ClusterID, labelRole: "replica"}}, Spec: spec}, metav1.CreateOptions{})
		} else if err == nil {
			l = l.DeepCopy()
			spec.AcquireTime = l.Spec.AcquireTime
			l.Spec = spec
			_, err = api.Update(ctx, l, metav1.UpdateOptions{})
		}
		if attempt > 0 || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
			return err
		}
		l, err = api.Get(ctx, m.cfg.replicaLease(), metav1.GetOptions{})
	}
}

// startElector runs client-go leader election for shard k. Leading gains
// the shard; losing the lease (renewals failing for RenewDeadline) loses it,
// stopping its workers before the lease can expire for others.
func (m *ShardManager) startElector(ctx context.Context, k int) {
	e := &elector{done: make(chan struct{})}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: m.cfg.shardLease(k), Namespace: m.cfg.Namespace},
		Client:     m.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: m.cfg.Identity},
		Labels:     map[string]string{labelCluster: m.cfg.ClusterID, labelRole: "shard"},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: m.cfg.LeaseDuration, RenewDeadline: m.cfg.RenewDeadline, RetryPeriod: m.cfg.RetryPeriod,
		// Released by hand, after the shard's workers stopped (client-go
		// would release before calling OnStoppedLeading).
		ReleaseOnCancel: false,
		Name:            m.cfg.shardLease(k),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				e.mu.Lock()
				if e.stopped {
					e.mu.Unlock()
					return
				}
				e.leading = true
				e.mu.Unlock()
				m.sup.GainShard(lctx, k)
			},
			OnStoppedLeading: func() {
				e.mu.Lock()
				was := e.leading
				e.leading, e.stopped = false, true
				e.mu.Unlock()
				if was {
					m.sup.LoseShard(k)
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
	m.mu.Lock()
	m.electors[k] = e
	m.mu.Unlock()
	go func() {
		defer close(e.done)
		le.Run(ectx)
		m.mu.Lock()
		if m.electors[k] == e {
			delete(m.electors, k)
		}
		m.mu.Unlock()
	}()
}

// handOver gives shard k up: its workers stop first, then the Lease is
// released, so another replica can take it within a retry period.
func (m *ShardManager) handOver(k int) {
	m.sup.LoseShard(k)
	m.stopElector(k)
	m.release(k)
}

func (m *ShardManager) stopElector(k int) {
	m.mu.Lock()
	e, ok := m.electors[k]
	m.mu.Unlock()
	if !ok {
		return
	}
	e.cancel()
	<-e.done
}

// release clears the holder of shard k's Lease if it is still ours, and
// sights the release at once (so the next reconcile does not take the Lease
// for one of ours left without an election and run for it again).
func (m *ShardManager) release(k int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	api := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace)
	m.seenMu.Lock()
	before := m.seen[m.cfg.shardLease(k)]
	m.seenMu.Unlock()
	l, err := api.Get(ctx, m.cfg.shardLease(k), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != m.cfg.Identity {
		return
	}
	now := metav1.NewMicroTime(time.Now())
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

// shutdown deletes the replica Lease first (so the others raise their quota
// at once), then hands every held shard over, all at the same time.
func (m *ShardManager) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Delete(ctx, m.cfg.replicaLease(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		m.log.Warn("Cannot delete the replica lease", "error", err)
	}
	m.mu.Lock()
	ks := make([]int, 0, len(m.electors))
	for k := range m.electors {
		ks = append(ks, k)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, k := range ks {
		wg.Go(func() { m.handOver(k) })
	}
	wg.Wait()
}
