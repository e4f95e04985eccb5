package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
)

// DefaultClaimPrefix is where cluster-id claims live in Consul's KV store.
const DefaultClaimPrefix = "fleetsync/clusters"

// ClaimValue is the content of a claim key: which Kubernetes cluster uses a
// cluster id (the UID of its kube-system namespace).
type ClaimValue struct {
	ClusterID string    `json:"clusterID"`
	KubeUID   string    `json:"kubernetesClusterUID"`
	Holder    string    `json:"holder"`
	ClaimedAt time.Time `json:"claimedAt"`
}

// ErrClaimedByOther is matched by the error Claim returns when the cluster
// id belongs to another Kubernetes cluster.
var ErrClaimedByOther = errors.New("cluster id claimed by another Kubernetes cluster")

// Claim is a held claim of a cluster id: a KV key under the prefix, locked
// by a Consul session that lives as long as the process (renewed every TTL/2;
// Release destroys it). Replicas of the same Kubernetes cluster share the
// claim: one holds the lock, the others check the value and retry the lock
// while they run. Release leaves the value in place, so a different cluster
// stays refused after this one stops.
type Claim struct {
	api     *api.Client
	key     string
	value   ClaimValue
	session string
	log     hclog.Logger
	done    chan struct{}
	stopped chan struct{}
}

// ClaimOptions say what to claim.
type ClaimOptions struct {
	Prefix    string // default DefaultClaimPrefix
	ClusterID string
	KubeUID   string
	Holder    string // e.g. the pod name
	Takeover  bool   // overwrite another cluster's claim when no live session holds it
	TTL       time.Duration
	Log       hclog.Logger
}

// ClaimClusterID claims opts.ClusterID for opts.KubeUID or explains who has
// it. The returned Claim must be Released.
func ClaimClusterID(ctx context.Context, c *api.Client, opts ClaimOptions) (*Claim, error) {
	if opts.Prefix == "" {
		opts.Prefix = DefaultClaimPrefix
	}
	if opts.TTL <= 0 {
		opts.TTL = 30 * time.Second
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	key := strings.TrimSuffix(opts.Prefix, "/") + "/" + opts.ClusterID
	q := (&api.WriteOptions{}).WithContext(ctx)
	session, _, err := c.Session().Create(&api.SessionEntry{
		Name: "fleetsync " + opts.ClusterID + " " + opts.Holder, TTL: opts.TTL.String(),
		Behavior: api.SessionBehaviorRelease, LockDelay: time.Millisecond,
	}, q)
	if err != nil {
		return nil, fmt.Errorf("claim cluster id %q: create consul session: %w", opts.ClusterID, err)
	}
	cl := &Claim{api: c, key: key, session: session, log: opts.Log, done: make(chan struct{}), stopped: make(chan struct{}),
		value: ClaimValue{ClusterID: opts.ClusterID, KubeUID: opts.KubeUID, Holder: opts.Holder, ClaimedAt: time.Now().UTC()}}
	if err := cl.establish(ctx, opts.Takeover); err != nil {
		_, _ = c.Session().Destroy(session, nil)
		return nil, err
	}
	go cl.keep(opts.TTL)
	return cl, nil
}

// establish checks the key and takes the lock when it is free.
func (cl *Claim) establish(ctx context.Context, takeover bool) error {
	kv := cl.api.KV()
	for attempt := 0; attempt < 5; attempt++ {
		pair, _, err := kv.Get(cl.key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("claim cluster id %q: read %s: %w", cl.value.ClusterID, cl.key, err)
		}
		if pair != nil {
			var have ClaimValue
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
				ok, _, err := kv.CAS(&api.KVPair{Key: cl.key, Value: cl.encode(), ModifyIndex: pair.ModifyIndex}, (&api.WriteOptions{}).WithContext(ctx))
				if err != nil {
					return fmt.Errorf("claim cluster id %q: take over %s: %w", cl.value.ClusterID, cl.key, err)
				}
				if !ok {
					continue // changed meanwhile: look again
				}
			}
			if pair.Session != "" && pair.Session != cl.session {
				cl.log.Info("Cluster id claimed by this Kubernetes cluster; another replica holds the lock", "key", cl.key, "holder", have.Holder)
				return nil
			}
		}
		ok, _, err := kv.Acquire(&api.KVPair{Key: cl.key, Value: cl.encode(), Session: cl.session}, (&api.WriteOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("claim cluster id %q: lock %s: %w", cl.value.ClusterID, cl.key, err)
		}
		if ok {
			cl.log.Info("Claimed cluster id", "key", cl.key, "kube_uid", cl.value.KubeUID)
			return nil
		}
	}
	return fmt.Errorf("claim cluster id %q: key %s kept changing", cl.value.ClusterID, cl.key)
}

// keep renews the session and retries the lock while another replica holds
// it, until Release.
func (cl *Claim) keep(ttl time.Duration) {
	defer close(cl.stopped)
	t := time.NewTicker(ttl / 2)
	defer t.Stop()
	for {
		select {
		case <-cl.done:
			return
		case <-t.C:
		}
		entry, _, err := cl.api.Session().Renew(cl.session, nil)
		if err != nil {
			cl.log.Warn("Cannot renew the cluster-id claim session", "error", err)
			continue
		}
		if entry == nil {
			// The session is gone (Consul lost its data, or it expired):
			// claim again, as at start, without taking anything over.
			cl.reclaim(ttl)
			continue
		}
		if pair, _, err := cl.api.KV().Get(cl.key, nil); err == nil && pair != nil && pair.Session == "" {
			_, _, _ = cl.api.KV().Acquire(&api.KVPair{Key: cl.key, Value: cl.encode(), Session: cl.session}, nil)
		}
	}
}

func (cl *Claim) reclaim(ttl time.Duration) {
	session, _, err := cl.api.Session().Create(&api.SessionEntry{
		Name: "fleetsync " + cl.value.ClusterID + " " + cl.value.Holder, TTL: ttl.String(),
		Behavior: api.SessionBehaviorRelease, LockDelay: time.Millisecond,
	}, nil)
	if err != nil {
		cl.log.Warn("Cannot re-create the cluster-id claim session", "error", err)
		return
	}
	cl.session = session
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	if err := cl.establish(ctx, false); err != nil {
		cl.log.Error("Cluster-id claim lost and not re-established", "error", err)
		return
	}
	cl.log.Info("Cluster-id claim re-established after its session vanished", "key", cl.key)
}

// Release ends the session (the lock goes; the claim value stays).
func (cl *Claim) Release() {
	close(cl.done)
	<-cl.stopped
	if _, err := cl.api.Session().Destroy(cl.session, nil); err != nil {
		cl.log.Warn("Cannot release the cluster-id claim session", "error", err)
	}
}

// Value returns what this process claimed.
func (cl *Claim) Value() ClaimValue { return cl.value }

func (cl *Claim) encode() []byte {
	b, _ := json.Marshal(cl.value)
	return b
}

// ReadClaim returns the claim of cluster id and whether a live session holds
// it (for `fleetsync status` and `purge`); nil when there is none.
func ReadClaim(ctx context.Context, c *api.Client, prefix, id string) (*ClaimValue, bool, error) {
	if prefix == "" {
		prefix = DefaultClaimPrefix
	}
	pair, _, err := c.KV().Get(strings.TrimSuffix(prefix, "/")+"/"+id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || pair == nil {
		return nil, false, err
	}
	var v ClaimValue
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
