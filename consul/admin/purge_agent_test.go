package admin_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/fence"
	"github.com/fleetsync/fleetsync/ownership"
)

// TestPurgeAndInventoryAgainstConsul: against the real agent, the
// inventory lists a cluster spread over two nodes with its instances, the
// entry without its mark and its claim; a held claim refuses the purge; a
// purge deregisters the marked instances only and keeps the nodes while
// the unmarked entry is on one; once it is gone, the next purge deletes
// both nodes and the released claim, and the cluster leaves the inventory.
// Another cluster's instances are never touched.
func TestPurgeAndInventoryAgainstConsul(t *testing.T) {
	agent := admin.Agent(t)
	ctx := t.Context()
	east, err := ownership.New("purge-east")
	must(t, err)
	east, err = east.WithNodes(2)
	must(t, err)
	west := mustCluster(t, "purge-west")
	const prefix = "purge-test/clusters"
	cn, err := conn.Open(conn.Config{Addresses: []string{agent.Addr}})
	must(t, err)

	var ours []consul.Instance
	for i := range 6 {
		ours = append(ours, east.Stamp(consul.Instance{ID: east.InstanceID("ns", fmt.Sprintf("svc-%d", i%3), fmt.Sprintf("10.1.0.%d", i+1), 80),
			Name: fmt.Sprintf("svc-%d", i%3), Address: fmt.Sprintf("10.1.0.%d", i+1), Port: 80, Check: consul.Check{Status: consul.StatusPassing}}))
	}
	_, err = consul.NewConnClient(cn, east, consul.Options{}).Apply(ctx, consul.Change{Register: ours})
	must(t, err)
	theirs := west.Stamp(consul.Instance{ID: west.InstanceID("ns", "svc-0", "10.2.0.1", 80), Name: "svc-0", Address: "10.2.0.1", Port: 80,
		Check: consul.Check{Status: consul.StatusPassing}})
	_, err = consul.NewConnClient(cn, west, consul.Options{}).Apply(ctx, consul.Change{Register: []consul.Instance{theirs}})
	must(t, err)
	t.Cleanup(func() {
		for _, n := range []string{east.NodeName(), east.NodeName() + ".1", west.NodeName()} {
			_, _ = agent.Client.Catalog().Deregister(&api.CatalogDeregistration{Node: n}, nil)
		}
		_, _ = agent.Client.KV().DeleteTree("purge-test/", nil)
	})
	// An entry without the mark on east's first node, registered by hand.
	first := east.Node()
	_, err = agent.Client.Catalog().Register(&api.CatalogRegistration{Node: first.Name, Address: first.Address, NodeMeta: first.Meta,
		Service: &api.AgentService{ID: "by-hand", Service: "svc-0", Address: "10.9.9.9", Port: 80}}, nil)
	must(t, err)
	// East's claim, held by a live session.
	value, _ := json.Marshal(claim.Value{ClusterID: east.ID(), KubeUID: "uid-east", Holder: "pod-east"})
	session, _, err := agent.Client.Session().Create(&api.SessionEntry{Behavior: api.SessionBehaviorRelease}, nil)
	must(t, err)
	key := prefix + "/" + east.ID()
	if ok, _, err := agent.Client.KV().Acquire(&api.KVPair{Key: key, Value: value, Session: session}, nil); err != nil || !ok {
		t.Fatalf("acquire %s: %t, %v", key, ok, err)
	}

	// The fences of east's shards sit under its claim (consul/fence):
	// not a cluster of the inventory; gone with the claim.
	for k := range 2 {
		_, err := agent.Client.KV().Put(&api.KVPair{Key: fence.Key(prefix, east.ID(), k), Value: []byte(`{"holder":"pod-east","generation":1}`)}, nil)
		must(t, err)
	}

	inv, err := admin.Inspect(ctx, cn, prefix, ownership.Finder{})
	must(t, err)
	got := clusterIn(inv, east.ID())
	if got == nil || got.Nodes != 2 || got.Instances != 6 || got.Services != 3 || got.Passing != 6 || got.Foreign != 1 ||
		got.Claim == nil || !got.Claim.Held || got.Claim.Holder != "pod-east" {
		t.Fatalf("inventory of %s: %+v", east.ID(), got)
	}
	if w := clusterIn(inv, west.ID()); w == nil || w.Instances != 1 || w.Claim != nil {
		t.Errorf("inventory of %s: %+v", west.ID(), w)
	}

	p := admin.NewPurger(cn, east, prefix)
	plan, err := p.Plan(ctx)
	must(t, err)
	if err := plan.Refusal(); err == nil || !strings.Contains(err.Error(), `claimed by a running fleetsync (holder "pod-east"`) {
		t.Fatalf("held claim: refusal %v", err)
	}
	_, err = agent.Client.Session().Destroy(session, nil) // the fleetsync stops: the claim is released, its value stays
	must(t, err)

	plan, err = p.Plan(ctx)
	must(t, err)
	if plan.Refusal() != nil || len(plan.Owned) != 6 || len(plan.Foreign) != 1 || plan.RemovesNode() || plan.RemovesClaim() ||
		plan.NodeNames() != "nodes k8s-purge-east, k8s-purge-east.1" {
		t.Fatalf("plan: %+v (%s)", plan, plan.NodeNames())
	}
	res, err := p.Execute(ctx, plan)
	must(t, err)
	if res.Deregistered != 6 || res.Services != 3 || len(res.NodesRemoved) != 0 || res.ClaimRemoved != "" || len(res.Kept.Foreign) != 1 {
		t.Fatalf("first purge: %+v", res)
	}
	for _, n := range []string{east.NodeName(), east.NodeName() + ".1"} {
		if cn, _, err := agent.Client.Catalog().Node(n, nil); err != nil || cn == nil {
			t.Errorf("node %s gone while an unmarked entry was on %s: %v", n, east.NodeName(), err)
		}
	}

	// Its owner removes the unmarked entry: the next purge takes the nodes
	// and the released claim.
	_, err = agent.Client.Catalog().Deregister(&api.CatalogDeregistration{Node: first.Name, ServiceID: "by-hand"}, nil)
	must(t, err)
	plan, err = p.Plan(ctx)
	must(t, err)
	if len(plan.Owned) != 0 || !plan.RemovesNode() || !plan.RemovesClaim() {
		t.Fatalf("second plan: %+v", plan)
	}
	res, err = p.Execute(ctx, plan)
	must(t, err)
	if len(res.NodesRemoved) != 2 || res.ClaimRemoved != key {
		t.Fatalf("second purge: %+v", res)
	}
	for _, n := range []string{east.NodeName(), east.NodeName() + ".1"} {
		if cn, _, err := agent.Client.Catalog().Node(n, nil); err != nil || cn != nil {
			t.Errorf("node %s after the purge: %+v, %v", n, cn, err)
		}
	}
	if pair, _, err := agent.Client.KV().Get(key, nil); err != nil || pair != nil {
		t.Errorf("claim %s after the purge: %+v, %v", key, pair, err)
	}
	if keys, _, err := agent.Client.KV().Keys(fence.KeyPrefix(prefix, east.ID()), "", nil); err != nil || len(keys) != 0 {
		t.Errorf("shard fences after the purge: %v, %v", keys, err)
	}
	left, err := consul.NewConnClient(cn, west, consul.Options{}).ReadNode(ctx)
	must(t, err)
	if len(left) != 1 || left[0].ID != theirs.ID || left[0].ServiceIndex == 0 {
		t.Errorf("%s's instances after %s's purge: %+v", west.ID(), east.ID(), left)
	}
	inv, err = admin.Inspect(ctx, cn, prefix, ownership.Finder{})
	must(t, err)
	if c := clusterIn(inv, east.ID()); c != nil {
		t.Errorf("%s still in the inventory after the purge: %+v", east.ID(), c)
	}
}

func clusterIn(inv admin.Inventory, id string) *admin.ClusterInventory {
	for i := range inv.Clusters {
		if inv.Clusters[i].ClusterID == id {
			return &inv.Clusters[i]
		}
	}
	return nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
