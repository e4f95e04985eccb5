package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/ownership"
)

// east is the cluster of the printing tests.
var east = func() ownership.Cluster {
	c, err := ownership.New("east")
	if err != nil {
		panic(err)
	}
	return c
}()

func TestWritePurgePlan(t *testing.T) {
	unmarked := consul.Registered{Instance: consul.Instance{ID: "by-hand", Name: "web"}, Node: east.NodeName()}
	ours := []consul.Registered{
		{Instance: east.Stamp(consul.Instance{ID: east.InstanceID("ns", "web", "10.0.0.1", 80), Name: "web"}), Node: east.NodeName()},
		{Instance: east.Stamp(consul.Instance{ID: east.InstanceID("ns", "web", "10.0.0.2", 80), Name: "web"}), Node: east.NodeName()},
		{Instance: east.Stamp(consul.Instance{ID: east.InstanceID("ns", "db", "10.0.0.3", 80), Name: "db"}), Node: east.NodeName()},
	}
	cases := []struct {
		name string
		plan admin.PurgePlan
		yes  bool
		want string
	}{
		{name: "dry run, node goes", plan: admin.PurgePlan{Cluster: east, NodeFound: true, Owned: ours}, want: `Would deregister 3 instances of 2 services carrying cluster east's mark, from node k8s-east:
  SERVICE  INSTANCES
  db       1
  web      2
Would then deregister node k8s-east: nothing else is on it.
Dry run: nothing changed. Stop every fleetsync running with --cluster-id=east, then run again with --yes.
`},
		{name: "dry run, node stays", plan: admin.PurgePlan{Cluster: east, NodeFound: true, Owned: ours[2:], Foreign: []consul.Registered{unmarked}, NodeChecks: []string{"maint"}},
			want: `Would deregister 1 instances of 1 services carrying cluster east's mark, from node k8s-east:
  SERVICE  INSTANCES
  db       1
Would keep node k8s-east: 2 entries without cluster east's mark stay on it (service web id by-hand; node check maint).
Dry run: nothing changed. Stop every fleetsync running with --cluster-id=east, then run again with --yes.
`},
		{name: "yes", plan: admin.PurgePlan{Cluster: east, NodeFound: true, Owned: ours[2:]}, yes: true,
			want: `Deregistering 1 instances of 1 services carrying cluster east's mark, from node k8s-east:
  SERVICE  INSTANCES
  db       1
`},
		{name: "no node", plan: admin.PurgePlan{Cluster: east}, want: "Node k8s-east is not in Consul: cluster east has nothing to purge.\n"},
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
	var b bytes.Buffer
	writePurgeResult(&b, admin.PurgeResult{Cluster: east, Deregistered: 3, Services: 2, Txns: 1, NodesRemoved: []string{"k8s-east"},
		Kept: admin.PurgePlan{Cluster: east, NodeFound: true, Nodes: []string{"k8s-east"}}})
	if want := "Deregistered 3 instances of 2 services of cluster east (1 transactions).\nDeregistered node k8s-east.\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	claim := &claim.Value{ClusterID: "east"}
	writePurgeResult(&b, admin.PurgeResult{Cluster: east, Deregistered: 2, Services: 1, Txns: 1,
		NodesRemoved: []string{"k8s-east", "k8s-east.2"}, NodesGone: []string{"k8s-east.3"},
		NodesKept: []admin.KeptNode{{Node: "k8s-east.1", Why: "service web id by-hand registered on it after purge read it"}},
		Kept:      admin.PurgePlan{Cluster: east, NodeFound: true, Nodes: []string{"k8s-east", "k8s-east.1", "k8s-east.2", "k8s-east.3"}, Claim: claim}})
	if want := "Deregistered 2 instances of 1 services of cluster east (1 transactions).\n" +
		"Deregistered nodes k8s-east, k8s-east.2.\n" +
		"Node k8s-east.3 was deleted by someone else meanwhile.\n" +
		"Kept node k8s-east.1: service web id by-hand registered on it after purge read it.\n" +
		"Kept the claim of cluster id east while a node of the cluster is left; run purge again to look again.\n"; b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	kept := admin.PurgePlan{Cluster: east, NodeFound: true, Foreign: []consul.Registered{{Instance: consul.Instance{ID: "by-hand", Name: "web"}}}}
	writePurgeResult(&b, admin.PurgeResult{Cluster: east, Deregistered: 1, Services: 1, Txns: 1, Kept: kept})
	if want := "Deregistered 1 instances of 1 services of cluster east (1 transactions).\nKept node k8s-east: 1 entries without cluster east's mark stay on it (service web id by-hand).\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

// TestPurgeClaimText: what purge prints about the released claim.
func TestPurgeClaimText(t *testing.T) {
	claim := &claim.Value{ClusterID: "east", KubeUID: "uid-1", Holder: "pod-1"}
	var b bytes.Buffer
	writePurgePlan(&b, admin.PurgePlan{Cluster: east, NodeFound: true, Claim: claim}, false)
	if !strings.Contains(b.String(), "Would then deregister node k8s-east: nothing else is on it.\nWould then remove the released claim of cluster id east.\n") {
		t.Errorf("plan:\n%s", b.String())
	}
	b.Reset()
	writePurgePlan(&b, admin.PurgePlan{Cluster: east, Claim: claim}, false)
	if b.String() != "Node k8s-east is not in Consul; would remove the released claim of cluster id east.\n" {
		t.Errorf("plan without node: %q", b.String())
	}
	b.Reset()
	writePurgeResult(&b, admin.PurgeResult{Cluster: east, ClaimRemoved: "fleetsync/clusters/east"})
	if b.String() != "Removed claim fleetsync/clusters/east: the cluster id is free for another Kubernetes cluster.\n" {
		t.Errorf("result: %q", b.String())
	}
}
