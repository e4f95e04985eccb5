package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestGuardRefusesAnotherClaimAtTheRememberedIndex: a Consul rebuilt empty
// counts its indexes from small numbers again, and another Kubernetes
// cluster's claim key lands at exactly the index this process remembers.
// The check-index alone passes; the check-session refuses, the re-check
// finds the claim lost, and nothing is written. On the twin and on a real
// Consul agent restarted empty.
func TestGuardRefusesAnotherClaimAtTheRememberedIndex(t *testing.T) {
	t.Run("twin", func(t *testing.T) {
		twin := consultest.New(t)
		refusedAtReusedIndex(t, twin.Client(), func(context.Context) error { twin.Wipe(); return nil })
	})
	t.Run("consul", func(t *testing.T) {
		if testing.Short() {
			t.Skip("needs a real Consul agent")
		}
		own, err := stack.StartConsul(t.Context(), stack.ConsulOptions{ExtraArgs: []string{"-hcl=disable_coordinates = true"}})
		if err != nil {
			t.Fatal(err)
		}
		defer own.Stop()
		refusedAtReusedIndex(t, own.Client, own.Restart)
	})
}

// refusedAtReusedIndex claims a cluster id on c, writes under the claim,
// rebuilds Consul empty, puts another cluster's claim at the remembered
// index and writes again: refused with ErrLost, nothing on the node.
func refusedAtReusedIndex(t *testing.T, c *api.Client, rebuild func(context.Context) error) {
	ctx := t.Context()
	// Lift the index well above what a restarted agent writes by itself,
	// so the remembered index can be reached again from below.
	if _, err := fill(c, 0, 40); err != nil {
		t.Fatal(err)
	}
	cl, err := ClusterID(ctx, c, Options{ClusterID: "reused", KubeUID: "uid-ours", Holder: "pod-a", TTL: time.Minute, CheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Release()
	owner, err := ownership.New("reused")
	if err != nil {
		t.Fatal(err)
	}
	store := consul.NewClient(c, owner, consul.Options{Guard: cl})
	instance := func(ip string) consul.Instance {
		return owner.Stamp(consul.Instance{ID: owner.InstanceID("ns", "web", ip, 80), Name: "web", Address: ip, Port: 80,
			Check: consul.Check{Status: consul.StatusPassing}})
	}
	if _, err := store.Apply(ctx, consul.Change{Register: []consul.Instance{instance("10.0.0.1")}}); err != nil {
		t.Fatalf("guarded write: %v", err)
	}
	remembered := cl.state.Load().index
	theirs := Value{ClusterID: "reused", KubeUID: "uid-theirs", Holder: "pod-x", ClaimedAt: time.Now().UTC()}
	var at uint64
	for attempt := 0; at != remembered; attempt++ {
		// A real agent's own writes after its start may take the index
		// meant for the claim: rebuild and try again.
		if attempt == 3 {
			t.Fatalf("another claim did not land at the remembered index %d in 3 rebuilds (last at %d)", remembered, at)
		}
		if err := rebuild(ctx); err != nil {
			t.Fatal(err)
		}
		if at, err = lockAt(c, DefaultPrefix+"/reused", theirs, remembered); err != nil {
			t.Fatal(err)
		}
	}
	// Twice: a write that failed for another reason (the node gone with
	// Consul's data) is followed by one that would land.
	var errs [2]error
	for i := range errs {
		_, errs[i] = store.Apply(ctx, consul.Change{Register: []consul.Instance{instance("10.0.0.2")}})
	}
	list, _, err := c.Catalog().NodeServiceList(owner.Node().Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if list != nil && len(list.Services) > 0 {
		t.Fatalf("our node on the rebuilt Consul: %d instances, want none; writes: %v", len(list.Services), errs)
	}
	for i, err := range errs {
		if !errors.Is(err, ErrLost) {
			t.Fatalf("write %d after another cluster's claim took the remembered index %d: err = %v, want ErrLost", i, remembered, err)
		}
	}
	if ok, why := cl.Held(); ok {
		t.Fatalf("Held after the refusal: %v %q", ok, why)
	}
}

// fill writes a scratch key until it was written at least n times and its
// index is at least floor; it returns the last write's index.
func fill(c *api.Client, floor uint64, n int) (uint64, error) {
	var idx uint64
	for i := 0; i < n || idx < floor; i++ {
		ok, resp, _, err := c.Txn().Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "fleetsync-test/filler", Value: fmt.Append(nil, i)}}}, nil)
		if err != nil || !ok {
			return 0, fmt.Errorf("fill the index: %v %+v", err, resp)
		}
		idx = resp.Results[0].KV.ModifyIndex
	}
	return idx, nil
}

// lockAt locks key with v under a new session, aiming at index at, and
// returns the index it landed at (at, unless another write came between).
func lockAt(c *api.Client, key string, v Value, at uint64) (uint64, error) {
	session, _, err := c.Session().Create(&api.SessionEntry{Name: "other cluster", TTL: "1m"}, nil)
	if err != nil {
		return 0, fmt.Errorf("other cluster's session: %w", err)
	}
	if idx, err := fill(c, at-1, 0); err != nil || idx >= at {
		return 0, fmt.Errorf("the rebuilt Consul is already at index %d, not below %d: %v", idx, at, err)
	}
	b, _ := json.Marshal(v)
	ok, resp, _, err := c.Txn().Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Value: b, Session: session}}}, nil)
	if err != nil || !ok {
		return 0, fmt.Errorf("lock %s: %v %+v", key, err, resp)
	}
	return resp.Results[0].KV.ModifyIndex, nil
}
