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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
	// for RenewDeadline gives the shard up (its workers stop) at least
	// LeaseDuration-RenewDeadline before anyone else can take it.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       hclog.Logger
}

// Validate checks the timing.
func (c ShardConfig) Validate() error {
	if c.Shards < 2 {
		return errors.New("shard leases need --shards of at least 2")
	}
	if !(c.RetryPeriod > 0 && c.RetryPeriod < c.RenewDeadline && c.RenewDeadline < c.LeaseDuration) {
		return fmt.Errorf("lease timing: need 0 < retry period (%s) < renew deadline (%s) < lease duration (%s)",
			c.RetryPeriod, c.RenewDeadline, c.LeaseDuration)
	}
	if c.Identity == "" || c.Namespace == "" {
		return errors.New("shard leases need a replica id and a lease namespace")
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
// a Lease per shard who syncs it (client-go leader election).
type ShardManager struct {
	cfg ShardConfig
	sup *Supervisor
	log hclog.Logger

	mu       sync.Mutex
	electors map[int]*elector
}

type elector struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	leading bool
	stopped bool
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
	return &ShardManager{cfg: cfg, sup: sup, log: cfg.Log, electors: map[int]*elector{}}
}

// Run takes part in shard ownership until ctx is done. It starts once the
// supervisor is bootstrapped; on the way out it stops the workers of every
// shard it holds, then releases the shard Leases (so a rolling update hands
// shards over within a retry period) and deletes its replica Lease.
func (m *ShardManager) Run(ctx context.Context) {
	tick := time.NewTicker(m.cfg.RetryPeriod)
	defer tick.Stop()
	for !m.sup.Bootstrapped() {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	for {
		m.reconcile(ctx)
		select {
		case <-ctx.Done():
			m.shutdown()
			return
		case <-tick.C:
		}
	}
}

// reconcile is one step: renew our replica Lease, compute the quota, shed
// extra shards, drop hopeless candidacies and run for free shards.
func (m *ShardManager) reconcile(ctx context.Context) {
	if err := m.renewPresence(ctx); err != nil {
		m.log.Warn("Cannot renew the replica lease", "error", err)
		return
	}
	live, shardHolders, suspect, err := m.observe(ctx)
	if err != nil {
		m.log.Warn("Cannot list leases", "error", err)
		return
	}
	quota := (m.cfg.Shards + live - 1) / live
	m.mu.Lock()
	var leading, candidates []int
	for k, e := range m.electors {
		if e.isLeading() {
			leading = append(leading, k)
		} else {
			candidates = append(candidates, k)
		}
	}
	m.mu.Unlock()
	m.sortByRank(leading)
	for len(leading) > quota { // shed the shards we like least
		k := leading[len(leading)-1]
		leading = leading[:len(leading)-1]
		m.log.Info("Handing a shard over to rebalance", "shard", k, "quota", quota, "live_replicas", live)
		m.handOver(k)
	}
	for _, k := range candidates {
		if h := shardHolders[k]; h != "" && h != m.cfg.Identity && !suspect[h] {
			m.stopElector(k) // a live replica has it: do not hoard
		}
	}
	m.mu.Lock()
	running := len(m.electors)
	m.mu.Unlock()
	var free, orphaned []int
	for k := 0; k < m.cfg.Shards; k++ {
		m.mu.Lock()
		_, mine := m.electors[k]
		m.mu.Unlock()
		switch h := shardHolders[k]; {
		case mine:
		case h == "":
			free = append(free, k)
		case suspect[h]:
			orphaned = append(orphaned, k)
		}
	}
	m.sortByRank(free)
	for i := 0; i < len(free) && running < quota; i++ {
		m.startElector(ctx, free[i])
		running++
	}
	// A shard whose holder stopped renewing its replica Lease is run for at
	// once by every replica, whatever its quota: client-go counts a lease
	// duration from when it first observes the Lease, so observing early
	// makes the takeover come one lease duration after the holder's last
	// renewal. A replica that ends up above its quota hands the extra over.
	for _, k := range orphaned {
		m.startElector(ctx, k)
	}
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

// observe lists the Leases of this cluster: the number of live replicas
// (this one included, suspects excluded), each shard's live holder ("" when
// free), and the replicas that stopped renewing their replica Lease for
// three retry periods (probably dead; their shard Leases are still valid).
func (m *ShardManager) observe(ctx context.Context) (int, map[int]string, map[string]bool, error) {
	list, err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, nil, nil, err
	}
	now := time.Now()
	live := 0
	holders := map[int]string{}
	suspect := map[string]bool{}
	shardPrefix := fmt.Sprintf("fleetsync-%s-shard-", m.cfg.ClusterID)
	for i := range list.Items {
		l := &list.Items[i]
		switch {
		case l.Labels[labelCluster] == m.cfg.ClusterID && l.Labels[labelRole] == "replica":
			id := ptr.Deref(l.Spec.HolderIdentity, "")
			fresh := l.Spec.RenewTime != nil && now.Sub(l.Spec.RenewTime.Time) < 2*m.cfg.RetryPeriod+time.Second
			switch {
			case id == m.cfg.Identity || (fresh && leaseAlive(l, now)):
				live++
			case id != "":
				suspect[id] = true
			}
		case strings.HasPrefix(l.Name, shardPrefix):
			k, err := strconv.Atoi(strings.TrimPrefix(l.Name, shardPrefix))
			if err == nil && leaseAlive(l, now) && l.Spec.HolderIdentity != nil {
				holders[k] = *l.Spec.HolderIdentity
			}
		}
	}
	for _, h := range holders {
		if h == m.cfg.Identity {
			delete(suspect, h)
		}
	}
	return max(live, 1), holders, suspect, nil
}

func leaseAlive(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).After(now)
}

// renewPresence creates or renews this replica's Lease.
func (m *ShardManager) renewPresence(ctx context.Context) error {
	api := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace)
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.cfg.Identity), RenewTime: &now,
		LeaseDurationSeconds: ptr.To(int32(m.cfg.LeaseDuration / time.Second))}
	l, err := api.Get(ctx, m.cfg.replicaLease(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		spec.AcquireTime = &now
		_, err = api.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: m.cfg.replicaLease(),
			Labels: map[string]string{labelCluster: m.cfg.ClusterID, labelRole: "replica"}}, Spec: spec}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	spec.AcquireTime = l.Spec.AcquireTime
	l.Spec = spec
	_, err = api.Update(ctx, l, metav1.UpdateOptions{})
	return err
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

// release clears the holder of shard k's Lease if it is still ours.
func (m *ShardManager) release(k int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	api := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace)
	l, err := api.Get(ctx, m.cfg.shardLease(k), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != m.cfg.Identity {
		return
	}
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity = ptr.To("")
	l.Spec.LeaseDurationSeconds = ptr.To(int32(1))
	l.Spec.RenewTime = &now
	if _, err := api.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		m.log.Warn("Cannot release the shard lease; it expires on its own", "shard", k, "error", err)
	}
}

// shutdown hands every held shard over and deletes the replica Lease.
func (m *ShardManager) shutdown() {
	m.mu.Lock()
	ks := make([]int, 0, len(m.electors))
	for k := range m.electors {
		ks = append(ks, k)
	}
	m.mu.Unlock()
	for _, k := range ks {
		m.handOver(k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.cfg.Client.CoordinationV1().Leases(m.cfg.Namespace).Delete(ctx, m.cfg.replicaLease(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		m.log.Warn("Cannot delete the replica lease", "error", err)
	}
}
