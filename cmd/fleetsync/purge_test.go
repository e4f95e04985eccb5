package main

import (
	"bytes"
	"strings"
	"testing"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/ownership"
)

func markedNode(c ownership.Cluster) *consulapi.Node {
	return &consulapi.Node{Node: c.NodeName(), Address: "127.0.0.1",
		Meta: map[string]string{ownership.MetaExternalSource: ownership.ExternalSource, ownership.MetaCluster: c.ID()}}
}

func TestNewPurgePlan(t *testing.T) {
	east, west := mustCluster(t, "east"), mustCluster(t, "west")
	unmarked := consul.Registered{Instance: consul.Instance{ID: "by-hand", Name: "web"}, Node: east.NodeName()}
	westMarked := owned(west, "web", "10.0.0.9", consul.StatusPassing, 1, 2)
	westMarked.Node = east.NodeName()
	ours := []consul.Registered{owned(east, "web", "10.0.0.2", consul.StatusPassing, 3, 4), owned(east, "db", "10.0.0.1", consul.StatusPassing, 5, 6)}
	serviceCheck := &consulapi.HealthCheck{CheckID: consul.CheckID("x"), ServiceID: "x"}
	nodeCheck := &consulapi.HealthCheck{CheckID: "serfHealth"}

	t.Run("spread over nodes: all of them go", func(t *testing.T) {
		third := markedNode(east)
		third.Node = east.NodeName() + ".3"
		onThird := owned(east, "api", "10.0.0.3", consul.StatusPassing, 7, 8)
		onThird.Node = third.Node
		p, err := newPurgePlan(east, []*consulapi.Node{third, markedNode(east)}, append([]consul.Registered{onThird}, ours...), nil)
		if err != nil || len(p.Owned) != 3 || !p.RemovesNode() || p.nodeNames() != "nodes k8s-east, k8s-east.3" {
			t.Fatalf("plan %+v (%s), err %v", p, p.nodeNames(), err)
		}
		foreign := markedNode(west)
		foreign.Node = east.NodeName() + ".5" // named like ours, marked as west's
		if _, err := newPurgePlan(east, []*consulapi.Node{markedNode(east), foreign}, ours, nil); err == nil || !strings.Contains(err.Error(), "refusing to touch node k8s-east.5") {
			t.Errorf("a node named like ours with west's mark: err = %v, want a refusal naming it", err)
		}
	})

	t.Run("only ours: everything goes, node included", func(t *testing.T) {
		p, err := newPurgePlan(east, []*consulapi.Node{markedNode(east)}, ours, consulapi.HealthChecks{serviceCheck})
		if err != nil || !p.NodeFound || len(p.Owned) != 2 || len(p.Foreign) != 0 || !p.RemovesNode() {
			t.Fatalf("plan %+v, err %v", p, err)
		}
		if p.Owned[0].Name != "db" {
			t.Errorf("owned not sorted by ID: %+v", p.Owned)
		}
	})
	t.Run("entries without our mark keep the node", func(t *testing.T) {
		p, err := newPurgePlan(east, []*consulapi.Node{markedNode(east)}, append([]consul.Registered{unmarked, westMarked}, ours...), nil)
		if err != nil || len(p.Owned) != 2 || len(p.Foreign) != 2 || p.RemovesNode() {
			t.Fatalf("plan %+v, err %v", p, err)
		}
	})
	t.Run("a node-level check keeps the node", func(t *testing.T) {
		p, err := newPurgePlan(east, []*consulapi.Node{markedNode(east)}, ours, consulapi.HealthChecks{nodeCheck, serviceCheck})
		if err != nil || p.RemovesNode() || len(p.NodeChecks) != 1 || p.NodeChecks[0] != "serfHealth" {
			t.Fatalf("plan %+v, err %v", p, err)
		}
	})
	t.Run("no node: nothing to do", func(t *testing.T) {
		p, err := newPurgePlan(east, nil, nil, nil)
		if err != nil || p.NodeFound || p.RemovesNode() {
			t.Fatalf("plan %+v, err %v", p, err)
		}
	})
	t.Run("a node without our mark is refused", func(t *testing.T) {
		for _, meta := range []map[string]string{
			{ownership.MetaExternalSource: ownership.ExternalSource, ownership.MetaCluster: "west"},
			{ownership.MetaExternalSource: ownership.ExternalSource},
			nil,
		} {
			n := &consulapi.Node{Node: east.NodeName(), Meta: meta}
			if _, err := newPurgePlan(east, []*consulapi.Node{n}, ours, nil); err == nil || !strings.Contains(err.Error(), "refusing to touch node k8s-east") {
				t.Errorf("meta %v: err %v", meta, err)
			}
		}
	})
}

func TestWritePurgePlan(t *testing.T) {
	east := mustCluster(t, "east")
	unmarked := consul.Registered{Instance: consul.Instance{ID: "by-hand", Name: "web"}, Node: east.NodeName()}
	ours := []consul.Registered{
		owned(east, "web", "10.0.0.1", consul.StatusPassing, 1, 2),
		owned(east, "web", "10.0.0.2", consul.StatusPassing, 1, 2),
		owned(east, "db", "10.0.0.3", consul.StatusPassing, 1, 2),
	}
	cases := []struct {
		name string
		plan purgePlan
		yes  bool
		want string
	}{
		{name: "dry run, node goes", plan: purgePlan{Cluster: east, NodeFound: true, Owned: ours}, want: `Would deregister 3 instances of 2 services carrying cluster east's mark, from node k8s-east:
  SERVICE  INSTANCES
  db       1
  web      2
Would then deregister node k8s-east: nothing else is on it.
Dry run: nothing changed. Stop every fleetsync running with --cluster-id=east, then run again with --yes.
`},
		{name: "dry run, node stays", plan: purgePlan{Cluster: east, NodeFound: true, Owned: ours[2:], Foreign: []consul.Registered{unmarked}, NodeChecks: []string{"maint"}},
			want: `Would deregister 1 instances of 1 services carrying cluster east's mark, from node k8s-east:
  SERVICE  INSTANCES
  db       1
Would keep node k8s-east: 2 entries without cluster east's mark stay on it (service web id by-hand; node check maint).
Dry run: nothing changed. Stop every fleetsync running with --cluster-id=east, then run again with --yes.
`},
		{name: "yes", plan: purgePlan{Cluster: east, NodeFound: true, Owned: ours[2:]}, yes: true,
			want: `Deregistering 1 instances of 1 services carrying cluster east's mark, from node k8s-east:
  SERVICE  INSTANCES
  db       1
`},
		{name: "no node", plan: purgePlan{Cluster: east}, want: "Node k8s-east is not in Consul: cluster east has nothing to purge.\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			writePurgePlan(&b, c.plan, c.yes)
			if b.String() != c.want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), c.want)
			}
		})
	}
}

func TestWritePurgeResult(t *testing.T) {
	east := mustCluster(t, "east")
	var b bytes.Buffer
	writePurgeResult(&b, purgeResult{Cluster: east, Deregistered: 3, Services: 2, Txns: 1, NodeRemoved: true})
	if want := "Deregistered 3 instances of 2 services of cluster east (1 transactions).\nDeregistered node k8s-east.\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	kept := purgePlan{Cluster: east, NodeFound: true, Foreign: []consul.Registered{{Instance: consul.Instance{ID: "by-hand", Name: "web"}}}}
	writePurgeResult(&b, purgeResult{Cluster: east, Deregistered: 1, Services: 1, Txns: 1, Kept: kept})
	if want := "Deregistered 1 instances of 1 services of cluster east (1 transactions).\nKept node k8s-east: 1 entries without cluster east's mark stay on it (service web id by-hand).\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

func TestPurgeClaim(t *testing.T) {
	east := mustCluster(t, "east")
	claim := &consul.ClaimValue{ClusterID: "east", KubeUID: "uid-1", Holder: "pod-1"}
	cases := []struct {
		name         string
		plan         purgePlan
		refused      bool
		removesClaim bool
	}{
		{"held claim refuses", purgePlan{Cluster: east, NodeFound: true, Claim: claim, ClaimHeld: true}, true, false},
		{"released claim goes with the node", purgePlan{Cluster: east, NodeFound: true, Claim: claim}, false, true},
		{"released claim stays while the node stays", purgePlan{Cluster: east, NodeFound: true, Claim: claim, NodeChecks: []string{"c"}}, false, false},
		{"released claim of a cluster without node", purgePlan{Cluster: east, Claim: claim}, false, true},
		{"no claim", purgePlan{Cluster: east, NodeFound: true}, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.plan.refusal()
			if (err != nil) != c.refused || (err != nil && !strings.Contains(err.Error(), `claimed by a running fleetsync (holder "pod-1"`)) {
				t.Errorf("refusal = %v, want refused %t", err, c.refused)
			}
			if got := c.plan.RemovesClaim(); got != c.removesClaim {
				t.Errorf("RemovesClaim = %t, want %t", got, c.removesClaim)
			}
		})
	}
	var b bytes.Buffer
	writePurgePlan(&b, purgePlan{Cluster: east, NodeFound: true, Claim: claim}, false)
	if !strings.Contains(b.String(), "Would then deregister node k8s-east: nothing else is on it.\nWould then remove the released claim of cluster id east.\n") {
		t.Errorf("plan:\n%s", b.String())
	}
	b.Reset()
	writePurgePlan(&b, purgePlan{Cluster: east, Claim: claim}, false)
	if b.String() != "Node k8s-east is not in Consul; would remove the released claim of cluster id east.\n" {
		t.Errorf("plan without node: %q", b.String())
	}
	b.Reset()
	writePurgeResult(&b, purgeResult{Cluster: east, ClaimRemoved: "fleetsync/clusters/east"})
	if b.String() != "Removed claim fleetsync/clusters/east: the cluster id is free for another Kubernetes cluster.\n" {
		t.Errorf("result: %q", b.String())
	}
}
