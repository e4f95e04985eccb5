package main

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/supervisor"
)

// readiness is what /readyz checks, in order: the fleet bootstrapped, the
// shard manager done with its first reconcile (when sharded), Consul
// answering, the cluster-id claim naming this cluster, and no problem the
// supervisor reports (a look-alike node, a failing check someone else put
// on our nodes or instances).
type readiness struct {
	sup    *supervisor.Supervisor
	health interface {
		Reachable(grace time.Duration) (bool, string)
	}
	grace time.Duration
	claim atomic.Pointer[claim.Claim]
	// shards is the shard manager (nil unless --shards > 1): not ready
	// until its first reconcile after bootstrap.
	shards interface{ Ready() (bool, string) }
}

func (r *readiness) setClaim(c *claim.Claim) { r.claim.Store(c) }

// check reports whether the daemon is ready and, if not, why.
func (r *readiness) check() (bool, string) {
	if !r.sup.Bootstrapped() {
		return false, "bootstrapping (informers syncing or owned Consul state not read yet)"
	}
	if r.shards != nil {
		if ok, why := r.shards.Ready(); !ok {
			return false, why
		}
	}
	if ok, why := r.health.Reachable(r.grace); !ok {
		return false, fmt.Sprintf("consul unreachable for over %s: %s", r.grace, why)
	}
	if c := r.claim.Load(); c != nil {
		if ok, why := c.Held(); !ok {
			return false, "writing stopped: " + why
		}
	}
	if p := r.sup.Problems(); len(p) > 0 {
		return false, strings.Join(p, "; ")
	}
	return true, ""
}
