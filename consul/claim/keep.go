package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// verify reads the claim and decides: still ours (index updated; the lock
// taken when free), free (claimed again), or another cluster's (lost).
func (cl *Claim) verify(ctx context.Context) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	pair, err := cl.read(ctx)
	if err != nil {
		return err
	}
	wasLost := cl.state.Load().lost != ""
	if pair != nil {
		var have Value
		if err := json.Unmarshal(pair.Value, &have); err != nil {
			return cl.lose(fmt.Sprintf("cluster id %q: claim key %s holds %q, not a fleetsync claim: writing nothing until it is a claim of this Kubernetes cluster again or removed", cl.value.ClusterID, cl.key, truncate(string(pair.Value), 80)), "")
		}
		if have.KubeUID != cl.value.KubeUID {
			return cl.lose(fmt.Sprintf("cluster id %q is now claimed in Consul (key %s) by Kubernetes cluster %s (holder %q, since %s); this is Kubernetes cluster %s: writing nothing, above all deleting nothing, until the claim is free again or names this cluster (two Kubernetes clusters under one --cluster-id delete each other's instances)",
				cl.value.ClusterID, cl.key, have.KubeUID, have.Holder, have.ClaimedAt.Format(time.RFC3339), cl.value.KubeUID), have.KubeUID)
		}
	}
	if pair == nil || pair.Session == "" {
		// Free (Consul lost the key, or the lock was released): claim it
		// again as at start, never taking another cluster's. Consul may
		// have lost our session with the key: a lock with a dead session
		// is refused (and costs a Raft apply), so make sure it lives.
		cl.renewLocked(ctx)
		if err := cl.establish(ctx, false); err != nil {
			if errors.Is(err, ErrClaimedByOther) {
				return cl.lose(err.Error(), "")
			}
			return err
		}
		if pair == nil {
			cl.log.Warn("Cluster-id claim was gone from Consul (Consul lost its data?); claimed again", "key", cl.key)
		}
	} else {
		cl.setSeen(pair)
	}
	if wasLost {
		cl.log.Info("Cluster-id claim names this Kubernetes cluster again; writing resumes", "key", cl.key)
	}
	return nil
}

// lose records why writing stops (logged once) and returns the error.
func (cl *Claim) lose(msg, other string) error {
	if cl.state.Load().lost == "" {
		cl.log.Error("Cluster-id claim lost to another Kubernetes cluster; every write stops", "key", cl.key, "kube_uid", other, "why", msg)
	}
	cl.setLost(msg)
	return &LostError{Msg: msg}
}

// Keep renews the session, re-creates it when Consul lost it, and re-checks
// the claim every Options.CheckInterval, until ctx is done or the
// claim is Released; it returns nil then (a lost claim is no error of
// Keep's: Held and every write refuse while it lasts, and writing resumes
// when the claim names this cluster again). Run it once, in the process's
// errgroup.
func (cl *Claim) Keep(ctx context.Context) error {
	cl.life.Lock()
	if cl.released || cl.keeping {
		cl.life.Unlock()
		return nil
	}
	cl.keeping = true
	cl.life.Unlock()
	defer close(cl.kept)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-cl.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(cl.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cl.renew(ctx)
		if err := cl.verify(ctx); err != nil && !errors.Is(err, ErrLost) && ctx.Err() == nil {
			cl.log.Warn("Cannot check the cluster-id claim", "error", err)
		}
	}
}

func (cl *Claim) renew(ctx context.Context) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.renewLocked(ctx)
}

// renewLocked renews the session; cl.mu is held.
func (cl *Claim) renewLocked(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, cl.timeout)
	defer cancel()
	entry, _, err := cl.api.Session().Renew(cl.session, kvWrite(cl.scope).WithContext(rctx))
	if err != nil {
		if ctx.Err() == nil {
			cl.log.Warn("Cannot renew the cluster-id claim session", "error", err)
		}
		return
	}
	if entry == nil {
		// The session is gone (Consul lost its data, someone destroyed
		// it, or it expired): a new one; verify claims the key again
		// if it is free.
		if err := cl.newSession(ctx); err != nil {
			cl.log.Warn("Cannot re-create the cluster-id claim session", "error", err)
		}
	}
}

// Release stops Keep, waits for it, and ends the session (the lock goes;
// the claim value stays).
func (cl *Claim) Release() {
	cl.life.Lock()
	if !cl.released {
		cl.released = true
		close(cl.done)
	}
	keeping := cl.keeping
	cl.life.Unlock()
	if keeping {
		<-cl.kept
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.destroySession()
}
