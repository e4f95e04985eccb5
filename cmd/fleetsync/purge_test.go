package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
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
	writePurgeResult(&b, purgeResult{Cluster: east, Deregistered: 3, Services: 2, Txns: 1, NodesRemoved: []string{"k8s-east"},
		Kept: purgePlan{Cluster: east, NodeFound: true, Nodes: []string{"k8s-east"}}})
	if want := "Deregistered 3 instances of 2 services of cluster east (1 transactions).\nDeregistered node k8s-east.\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	claim := &consul.ClaimValue{ClusterID: "east"}
	writePurgeResult(&b, purgeResult{Cluster: east, Deregistered: 2, Services: 1, Txns: 1,
		NodesRemoved: []string{"k8s-east", "k8s-east.2"}, NodesGone: []string{"k8s-east.3"},
		NodesKept: []keptNode{{Node: "k8s-east.1", Why: "service web id by-hand registered on it after purge read it"}},
		Kept:      purgePlan{Cluster: east, NodeFound: true, Nodes: []string{"k8s-east", "k8s-east.1", "k8s-east.2", "k8s-east.3"}, Claim: claim}})
	if want := "Deregistered 2 instances of 1 services of cluster east (1 transactions).\n" +
		"Deregistered nodes k8s-east, k8s-east.2.\n" +
		"Node k8s-east.3 was deleted by someone else meanwhile.\n" +
		"Kept node k8s-east.1: service web id by-hand registered on it after purge read it.\n" +
		"Kept the claim of cluster id east while a node of the cluster is left; run purge again to look again.\n"; b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
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

// fakeNodes is a catalog of nodes, services and node checks that follows
// Consul's rules for what removeNode does: a node write moves the node's
// ModifyIndex only when it changes the node, so a service registered with
// the node's data unchanged leaves the index alone; CAS ops roll back on
// another index; a node delete takes its services and checks with it.
// before, when set, runs before each call, named cas (the fence or the
// unfence), read, checks or delete, and also before the first call as
// "first": another writer between two steps, or between purge's read and
// whatever it does next.
type fakeNodes struct {
	index    uint64
	nodes    map[string]*consulapi.Node
	services map[string][]*consulapi.AgentService
	checks   map[string]consulapi.HealthChecks
	txns     []consulapi.NodeOp
	calls    int
	before   func(f *fakeNodes, call string)
}

func newFakeNodes(nodes ...*consulapi.Node) *fakeNodes {
	f := &fakeNodes{index: 10, nodes: map[string]*consulapi.Node{}, services: map[string][]*consulapi.AgentService{}, checks: map[string]consulapi.HealthChecks{}}
	for _, n := range nodes {
		f.writeNode(*n)
	}
	return f
}

func (f *fakeNodes) call(name string) {
	if f.before == nil {
		return
	}
	if f.calls++; f.calls == 1 {
		f.before(f, "first")
	}
	f.before(f, name)
}

// writeNode is a node registration: a new index only for a change.
func (f *fakeNodes) writeNode(n consulapi.Node) *consulapi.Node {
	have := f.nodes[n.Node]
	if have != nil && have.Address == n.Address && maps.Equal(have.Meta, n.Meta) {
		return have
	}
	f.index++
	n.Meta = maps.Clone(n.Meta)
	n.ModifyIndex = f.index
	if have == nil {
		n.CreateIndex = f.index
	}
	f.nodes[n.Node] = &n
	return &n
}

// register is a catalog registration of a service with its node.
func (f *fakeNodes) register(n consulapi.Node, id string) {
	f.writeNode(n)
	f.index++
	f.services[n.Node] = append(f.services[n.Node], &consulapi.AgentService{ID: id, Service: "web", ModifyIndex: f.index})
}

func (f *fakeNodes) deleteNode(name string) {
	f.index++
	delete(f.nodes, name)
	delete(f.services, name)
	delete(f.checks, name)
}

func (f *fakeNodes) CatalogNode(name string, _ *consulapi.QueryOptions) (*consulapi.CatalogNode, *consulapi.QueryMeta, error) {
	f.call("read")
	n := f.nodes[name]
	if n == nil {
		return nil, &consulapi.QueryMeta{}, nil
	}
	c := *n
	out := &consulapi.CatalogNode{Node: &c, Services: map[string]*consulapi.AgentService{}}
	for _, s := range f.services[name] {
		out.Services[s.ID] = s
	}
	return out, &consulapi.QueryMeta{}, nil
}

func (f *fakeNodes) HealthNode(name string, _ *consulapi.QueryOptions) (consulapi.HealthChecks, *consulapi.QueryMeta, error) {
	f.call("checks")
	return f.checks[name], &consulapi.QueryMeta{}, nil
}

func (f *fakeNodes) Txn(ops consulapi.TxnOps, _ *consulapi.QueryOptions) (bool, *consulapi.TxnResponse, *consulapi.QueryMeta, error) {
	if len(ops) != 1 || ops[0].Node == nil {
		return false, nil, nil, fmt.Errorf("fake: want one node op, got %d ops", len(ops))
	}
	op := ops[0].Node
	f.txns = append(f.txns, op.Verb)
	stale := &consulapi.TxnResponse{Errors: consulapi.TxnErrors{{OpIndex: 0, What: fmt.Sprintf("failed to set node %q, index is stale", op.Node.Node)}}}
	switch op.Verb {
	case consulapi.NodeCAS:
		f.call("cas")
		have := f.nodes[op.Node.Node]
		if have == nil || have.ModifyIndex != op.Node.ModifyIndex {
			return false, stale, &consulapi.QueryMeta{}, nil
		}
		n := f.writeNode(op.Node)
		return true, &consulapi.TxnResponse{Results: consulapi.TxnResults{{Node: n}}}, &consulapi.QueryMeta{}, nil
	case consulapi.NodeDeleteCAS:
		f.call("delete")
		have := f.nodes[op.Node.Node]
		if have == nil || have.ModifyIndex != op.Node.ModifyIndex {
			return false, stale, &consulapi.QueryMeta{}, nil
		}
		f.deleteNode(op.Node.Node)
		return true, &consulapi.TxnResponse{}, &consulapi.QueryMeta{}, nil
	}
	return false, nil, nil, fmt.Errorf("fake: node verb %q not expected from purge", op.Verb)
}

// TestRemoveNode: purge deletes a node only while it is marked, unchanged
// since it was read and empty; a node someone changed, replaced, or
// registered something on in between is left, with why, and without the
// fence purge put on it.
func TestRemoveNode(t *testing.T) {
	east := mustCluster(t, "east")
	mark := markedNode(east)
	foreignMeta := map[string]string{ownership.MetaExternalSource: ownership.ExternalSource, ownership.MetaCluster: "west"}
	once := func(at string, do func(f *fakeNodes)) func(*fakeNodes, string) {
		done := false
		return func(f *fakeNodes, call string) {
			if call == at && !done {
				done = true
				do(f)
			}
		}
	}
	tests := []struct {
		name    string
		read    func(f *fakeNodes) *consulapi.Node // the node as purge read it; default: as stored
		before  func(*fakeNodes, string)
		want    nodeFate
		why     string             // substring of want.why
		txns    []consulapi.NodeOp // sent, in order
		kept    bool               // the node is still there, without the fence
		service string             // a service that must still be there
	}{
		{
			name: "marked, empty, unchanged: fenced, then deleted",
			want: nodeFate{removed: true},
			txns: []consulapi.NodeOp{consulapi.NodeCAS, consulapi.NodeDeleteCAS},
		},
		{
			name: "a node of our name without our mark: nothing sent",
			read: func(f *fakeNodes) *consulapi.Node {
				n := *f.nodes[mark.Node]
				n.Meta = foreignMeta
				return &n
			},
			why: "refusing to touch node k8s-east", kept: true,
		},
		{
			name:   "changed after the read: left as it is",
			before: once("first", func(f *fakeNodes) { n := *mark; n.Address = "10.9.9.9"; f.writeNode(n) }),
			why:    "it changed after purge read it", txns: []consulapi.NodeOp{consulapi.NodeCAS}, kept: true,
		},
		{
			name: "replaced after the read by a foreign node of our name: left as it is",
			before: once("first", func(f *fakeNodes) {
				f.deleteNode(mark.Node)
				n := *mark
				n.Meta = foreignMeta
				f.register(n, "west-web")
			}),
			why: "it changed after purge read it", txns: []consulapi.NodeOp{consulapi.NodeCAS}, kept: true, service: "west-web",
		},
		{
			name:   "a service registered after the read, node index unchanged (as Consul does): seen by the last read",
			before: once("first", func(f *fakeNodes) { f.register(*mark, "by-hand") }),
			why:    "service web id by-hand registered on it after purge read it",
			txns:   []consulapi.NodeOp{consulapi.NodeCAS, consulapi.NodeCAS}, kept: true, service: "by-hand",
		},
		{
			name:   "a service registered after the last read: the registration rewrites the fenced node, the delete fails",
			before: once("delete", func(f *fakeNodes) { f.register(*mark, "k8s_east_shop_web_10.0.0.1_80") }),
			why:    "written to while purge was deleting it",
			txns:   []consulapi.NodeOp{consulapi.NodeCAS, consulapi.NodeDeleteCAS}, kept: true, service: "k8s_east_shop_web_10.0.0.1_80",
		},
		{
			name: "a node check registered after the read",
			before: once("first", func(f *fakeNodes) {
				f.checks[mark.Node] = consulapi.HealthChecks{{Node: mark.Node, CheckID: "maint"}}
			}),
			why:  "node check maint registered on it after purge read it",
			txns: []consulapi.NodeOp{consulapi.NodeCAS, consulapi.NodeCAS}, kept: true,
		},
		{
			name:   "deleted by someone else before the fence",
			before: once("first", func(f *fakeNodes) { f.deleteNode(mark.Node) }),
			want:   nodeFate{gone: true}, txns: []consulapi.NodeOp{consulapi.NodeCAS},
		},
		{
			name:   "deleted by someone else after the fence",
			before: once("read", func(f *fakeNodes) { f.deleteNode(mark.Node) }),
			want:   nodeFate{gone: true}, txns: []consulapi.NodeOp{consulapi.NodeCAS},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeNodes(mark)
			read := f.nodes[mark.Node]
			if tt.read != nil {
				read = tt.read(f)
			}
			readCopy := *read
			f.before = tt.before
			got, err := removeNode(context.Background(), f, east, &readCopy)
			if err != nil {
				t.Fatal(err)
			}
			if tt.why != "" {
				if got.removed || got.gone || !strings.Contains(got.why, tt.why) {
					t.Errorf("fate %+v, want kept because %q", got, tt.why)
				}
			} else if got != tt.want {
				t.Errorf("fate %+v, want %+v", got, tt.want)
			}
			if !slices.Equal(f.txns, tt.txns) {
				t.Errorf("sent %v, want %v", f.txns, tt.txns)
			}
			n := f.nodes[mark.Node]
			switch {
			case tt.kept && n == nil:
				t.Errorf("node %s deleted", mark.Node)
			case tt.kept && n.Meta[purgeFenceMeta] != "":
				t.Errorf("node %s kept with the fence on: %v", mark.Node, n.Meta)
			case got.removed && n != nil:
				t.Errorf("removed, but node %s is still there: %+v", mark.Node, n)
			}
			if tt.service != "" && len(f.services[mark.Node]) == 0 {
				t.Errorf("service %s deleted with the node", tt.service)
			}
		})
	}
}
