package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/conn"
)

// DefaultPrefix is where cluster-id claims live in Consul's KV store.
const DefaultPrefix = "fleetsync/clusters"

// Value is the content of a claim key: which Kubernetes cluster uses a
// cluster id (the UID of its kube-system namespace).
type Value struct {
	ClusterID string    `json:"clusterID"`
	KubeUID   string    `json:"kubernetesClusterUID"`
	Holder    string    `json:"holder"`
	ClaimedAt time.Time `json:"claimedAt"`
}

// ErrClaimedByOther is matched by the error Claim returns when the cluster
// id belongs to another Kubernetes cluster.
var ErrClaimedByOther = errors.New("cluster id claimed by another Kubernetes cluster")

// ErrLost is matched by the error Apply returns (and Claim.Ops) when
// the cluster id's claim names another Kubernetes cluster now: this process
// must not write, above all not delete, since the other cluster's instances
// carry the same mark.
var ErrLost = errors.New("cluster-id claim lost to another Kubernetes cluster")

// LostError says who holds the claim now.
type LostError struct{ Msg string }

func (e *LostError) Error() string { return e.Msg }
func (e *LostError) Is(target error) bool {
	return target == ErrLost || target == consul.ErrRefused
}

// Claim is a held claim of a cluster id: a KV key under the prefix, locked
// by a Consul session that lives as long as the process (renewed every TTL/2;
// Release destroys it). Replicas of the same Kubernetes cluster share the
// claim: one holds the lock, the others check the value and retry the lock
// while they run. Release leaves the value in place, so a different cluster
// stays refused after this one stops.
//
// A Claim is also a Guard for the consul Client: every transaction carries
// a check that the claim key is still at the index, and still locked by the
// session, this process last saw naming its own Kubernetes cluster, so from
// the moment another cluster takes the claim no write of this process can
// land. The session check holds where the index alone does not: a Consul
// rebuilt empty counts its indexes from small numbers again, so another
// cluster's claim can sit at exactly the remembered index, but never under
// the session (a UUID) that locked ours. A failed check re-reads
// the key: still ours (a replica took or released the lock, or Consul lost
// its data and the key is free again: it is claimed again), writing goes on;
// another cluster's, the claim is lost: Op refuses every write until the key
// is free again or names this cluster.
type Claim struct {
	api     *api.Client
	key     string
	value   Value
	ttl     time.Duration
	timeout time.Duration
	scope   consul.Scope
	log     hclog.Logger
	// interval is Keep's period; done is closed by Release, which then
	// waits for a Keep that started (kept closed when it ends).
	interval time.Duration
	life     sync.Mutex // guards released and keeping
	released bool
	keeping  bool
	done     chan struct{}
	kept     chan struct{}

	mu      sync.Mutex // serialises the claim's requests; guards session
	session string
	// state is what Ops and Held read without waiting for a request in
	// flight: the key's index and lock session when last seen naming this
	// cluster, and why writing is refused ("" while the claim is ours).
	state atomic.Pointer[claimState]
}

type claimState struct {
	index   uint64
	session string
	lost    string
}

// setSeen records the claim key as seen naming this cluster.
func (cl *Claim) setSeen(p *api.KVPair) {
	cl.state.Store(&claimState{index: p.ModifyIndex, session: p.Session})
}

func (cl *Claim) setLost(why string) {
	st := *cl.state.Load()
	st.lost = why
	cl.state.Store(&st)
}

// Options say what to claim.
type Options struct {
	Prefix    string // default DefaultPrefix
	ClusterID string
	KubeUID   string
	Holder    string // e.g. the pod name
	Takeover  bool   // overwrite another cluster's claim when no live session holds it
	TTL       time.Duration
	// RequestTimeout bounds each request (default conn.DefaultRequestTimeout).
	RequestTimeout time.Duration
	// CheckInterval is how often the claim is renewed and re-checked
	// (default min(TTL/2, 5s)).
	CheckInterval time.Duration
	Log           hclog.Logger
	// Scope puts the key and its session in a namespace and partition
	// (Consul Enterprise; see consul.Scope).
	Scope consul.Scope
}

// ClusterID claims opts.ClusterID for opts.KubeUID or explains who has
// it. The caller runs the returned Claim's Keep (renewal and re-checks)
// and must Release it.
func ClusterID(ctx context.Context, c *api.Client, opts Options) (*Claim, error) {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.TTL <= 0 {
		opts.TTL = 30 * time.Second
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = conn.DefaultRequestTimeout
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = min(opts.TTL/2, 5*time.Second)
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	key := strings.TrimSuffix(opts.Prefix, "/") + "/" + opts.ClusterID
	cl := &Claim{api: c, key: key, ttl: opts.TTL, timeout: opts.RequestTimeout, log: opts.Log, scope: opts.Scope.Normal(),
		done: make(chan struct{}), kept: make(chan struct{}),
		value: Value{ClusterID: opts.ClusterID, KubeUID: opts.KubeUID, Holder: opts.Holder, ClaimedAt: time.Now().UTC()}}
	cl.state.Store(&claimState{})
	if err := cl.newSession(ctx); err != nil {
		return nil, err
	}
	cl.mu.Lock()
	err := cl.establish(ctx, opts.Takeover)
	cl.mu.Unlock()
	if err != nil {
		cl.destroySession()
		return nil, err
	}
	cl.interval = opts.CheckInterval
	return cl, nil
}

func (cl *Claim) newSession(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, cl.timeout)
	defer cancel()
	session, _, err := cl.api.Session().Create(&api.SessionEntry{
		Name: "fleetsync " + cl.value.ClusterID + " " + cl.value.Holder, TTL: cl.ttl.String(),
		Behavior: api.SessionBehaviorRelease, LockDelay: time.Millisecond,
	}, kvWrite(cl.scope).WithContext(rctx))
	if err != nil {
		return fmt.Errorf("claim cluster id %q: create consul session: %w", cl.value.ClusterID, err)
	}
	cl.session = session
	return nil
}

func (cl *Claim) destroySession() {
	ctx, cancel := context.WithTimeout(context.Background(), cl.timeout)
	defer cancel()
	if _, err := cl.api.Session().Destroy(cl.session, kvWrite(cl.scope).WithContext(ctx)); err != nil {
		cl.log.Warn("Cannot release the cluster-id claim session", "error", err)
	}
}

// establish checks the key and takes the lock when it is free; on success
// the state holds the key's index naming this cluster. cl.mu is held.
func (cl *Claim) establish(ctx context.Context, takeover bool) error {
	kv := cl.api.KV()
	for attempt := 0; attempt < 5; attempt++ {
		pair, err := cl.read(ctx)
		if err != nil {
			return err
		}
		if pair != nil {
			var have Value
			if err := json.Unmarshal(pair.Value, &have); err != nil {
				return fmt.Errorf("claim cluster id %q: key %s holds %q, not a fleetsync claim; remove it or choose another --claim-prefix", cl.value.ClusterID, cl.key, truncate(string(pair.Value), 80))
			}
			if have.KubeUID != cl.value.KubeUID {
				switch {
				case !takeover:
					return fmt.Errorf("%w: cluster id %q is claimed in Consul (key %s) by Kubernetes cluster %s (holder %q, since %s, lock %s); this is Kubernetes cluster %s. Choose another --cluster-id, or, if that cluster is gone for good, start once with --takeover-cluster-id",
						ErrClaimedByOther, cl.value.ClusterID, cl.key, have.KubeUID, have.Holder, have.ClaimedAt.Format(time.RFC3339), lockState(pair), cl.value.KubeUID)
				case pair.Session != "":
					return fmt.Errorf("%w: cluster id %q is held right now by a running fleetsync of Kubernetes cluster %s (holder %q); stop it before --takeover-cluster-id", ErrClaimedByOther, cl.value.ClusterID, have.KubeUID, have.Holder)
				}
				cl.log.Warn("Taking over a cluster id claimed by another Kubernetes cluster", "key", cl.key, "previous_kube_uid", have.KubeUID, "previous_holder", have.Holder)
				rctx, cancel := context.WithTimeout(ctx, cl.timeout)
				_, _, err := kv.CAS(&api.KVPair{Key: cl.key, Value: cl.encode(), ModifyIndex: pair.ModifyIndex}, kvWrite(cl.scope).WithContext(rctx))
				cancel()
				if err != nil {
					return fmt.Errorf("claim cluster id %q: take over %s: %w", cl.value.ClusterID, cl.key, err)
				}
				continue // look again: what we wrote, or who changed it meanwhile
			}
			if pair.Session != "" && pair.Session != cl.session {
				cl.setSeen(pair)
				cl.log.Debug("Cluster id claimed by this Kubernetes cluster; another replica holds the lock", "key", cl.key, "holder", have.Holder)
				return nil
			}
			if pair.Session == cl.session {
				cl.setSeen(pair)
				return nil
			}
		}
		rctx, cancel := context.WithTimeout(ctx, cl.timeout)
		ok, _, err := kv.Acquire(&api.KVPair{Key: cl.key, Value: cl.encode(), Session: cl.session}, kvWrite(cl.scope).WithContext(rctx))
		cancel()
		if err != nil {
			return fmt.Errorf("claim cluster id %q: lock %s: %w", cl.value.ClusterID, cl.key, err)
		}
		if ok {
			cl.log.Info("Claimed cluster id", "key", cl.key, "kube_uid", cl.value.KubeUID)
		}
		// Look again: the index of our lock, or who was faster.
	}
	return fmt.Errorf("claim cluster id %q: key %s kept changing", cl.value.ClusterID, cl.key)
}

func (cl *Claim) read(ctx context.Context) (*api.KVPair, error) {
	rctx, cancel := context.WithTimeout(ctx, cl.timeout)
	defer cancel()
	pair, _, err := cl.api.KV().Get(cl.key, kvQuery(cl.scope, &api.QueryOptions{RequireConsistent: true}).WithContext(rctx))
	if err != nil {
		return nil, fmt.Errorf("claim cluster id %q: read %s: %w", cl.value.ClusterID, cl.key, err)
	}
	return pair, nil
}

// Ops are the guard ops of every transaction: the claim key must still be
// at the index, and locked by the session, last seen naming this cluster.
func (cl *Claim) Ops() (api.TxnOps, error) {
	st := cl.state.Load()
	if st.lost != "" {
		return nil, &LostError{Msg: st.lost}
	}
	return api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: cl.key, Index: st.index, Namespace: cl.scope.Namespace, Partition: cl.scope.Partition}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: cl.key, Session: st.session, Namespace: cl.scope.Namespace, Partition: cl.scope.Partition}},
	}, nil
}

// Failed re-checks the claim after a transaction's guard op failed.
func (cl *Claim) Failed(ctx context.Context) error {
	return cl.verify(ctx)
}

// Held reports whether this process may write, and why not.
func (cl *Claim) Held() (bool, string) {
	st := cl.state.Load()
	return st.lost == "", st.lost
}

// Value returns what this process claimed.
func (cl *Claim) Value() Value { return cl.value }

func (cl *Claim) encode() []byte {
	b, _ := json.Marshal(cl.value)
	return b
}

// Read returns the claim of cluster id and whether a live session holds
// it (for `fleetsync status` and `purge`); nil when there is none.
func Read(ctx context.Context, c *api.Client, prefix, id string) (*Value, bool, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	rctx, cancel := context.WithTimeout(ctx, conn.DefaultRequestTimeout)
	defer cancel()
	pair, _, err := c.KV().Get(strings.TrimSuffix(prefix, "/")+"/"+id, (&api.QueryOptions{}).WithContext(rctx))
	if err != nil || pair == nil {
		return nil, false, err
	}
	var v Value
	if err := json.Unmarshal(pair.Value, &v); err != nil {
		return nil, false, fmt.Errorf("claim of %q is not a fleetsync claim: %w", id, err)
	}
	return &v, pair.Session != "", nil
}

func lockState(p *api.KVPair) string {
	if p.Session != "" {
		return "held by a live session"
	}
	return "not held (its fleetsync is not running)"
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// kvQuery is a read of the claim key in the scope's namespace and
// partition (scope is normal).
func kvQuery(scope consul.Scope, q *api.QueryOptions) *api.QueryOptions {
	q.Namespace, q.Partition = scope.Namespace, scope.Partition
	return q
}

// kvWrite is a write of the claim key or its session in the scope's
// namespace and partition (scope is normal).
func kvWrite(scope consul.Scope) *api.WriteOptions {
	return &api.WriteOptions{Namespace: scope.Namespace, Partition: scope.Partition}
}
