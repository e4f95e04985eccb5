package admin_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/ownership"
)

func mustCluster(t *testing.T, id string) ownership.Cluster {
	t.Helper()
	c, err := ownership.New(id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// owned returns an entry carrying c's mark, as read from Consul.
func owned(c ownership.Cluster, name, addr string, status string, svcIndex, checkIndex uint64) consul.Registered {
	in := c.Stamp(consul.Instance{ID: c.InstanceID("ns", name, addr, 80), Name: name, Address: addr, Port: 80,
		Check: consul.Check{Status: status}})
	return consul.Registered{Instance: in, Node: c.NodeName(), ServiceIndex: svcIndex, CheckIndex: checkIndex, HasCheck: status != ""}
}

func markedNode(c ownership.Cluster) *api.Node {
	return &api.Node{Node: c.NodeName(), Address: "127.0.0.1",
		Meta: map[string]string{ownership.MetaExternalSource: ownership.ExternalSource, ownership.MetaCluster: c.ID()}}
}

func TestNewPurgePlan(t *testing.T) {
	east, west := mustCluster(t, "east"), mustCluster(t, "west")
	unmarked := consul.Registered{Instance: consul.Instance{ID: "by-hand", Name: "web"}, Node: east.NodeName()}
	westMarked := owned(west, "web", "10.0.0.9", consul.StatusPassing, 1, 2)
	westMarked.Node = east.NodeName()
	ours := []consul.Registered{owned(east, "web", "10.0.0.2", consul.StatusPassing, 3, 4), owned(east, "db", "10.0.0.1", consul.StatusPassing, 5, 6)}
	serviceCheck := &api.HealthCheck{CheckID: consul.CheckID("x"), ServiceID: "x"}
	nodeCheck := &api.HealthCheck{CheckID: "serfHealth"}

	t.Run("spread over nodes: all of them go", func(t *testing.T) {
		third := markedNode(east)
		third.Node = east.NodeName() + ".3"
		onThird := owned(east, "api", "10.0.0.3", consul.StatusPassing, 7, 8)
		onThird.Node = third.Node
		p, err := admin.NewPurgePlan(east, []*api.Node{third, markedNode(east)}, append([]consul.Registered{onThird}, ours...), nil)
		if err != nil || len(p.Owned) != 3 || !p.RemovesNode() || p.NodeNames() != "nodes k8s-east, k8s-east.3" {
			t.Fatalf("plan %+v (%s), err %v", p, p.NodeNames(), err)
		}
		foreign := markedNode(west)
		foreign.Node = east.NodeName() + ".5" // named like ours, marked as west's
		if _, err := admin.NewPurgePlan(east, []*api.Node{markedNode(east), foreign}, ours, nil); err == nil || !strings.Contains(err.Error(), "refusing to touch node k8s-east.5") {
			t.Errorf("a node named like ours with west's mark: err = %v, want a refusal naming it", err)
		}
	})

	t.Run("only ours: everything goes, node included", func(t *testing.T) {
		p, err := admin.NewPurgePlan(east, []*api.Node{markedNode(east)}, ours, api.HealthChecks{serviceCheck})
		if err != nil || !p.NodeFound || len(p.Owned) != 2 || len(p.Foreign) != 0 || !p.RemovesNode() {
			t.Fatalf("plan %+v, err %v", p, err)
		}
		if p.Owned[0].Name != "db" {
			t.Errorf("owned not sorted by ID: %+v", p.Owned)
		}
	})
	t.Run("entries without our mark keep the node", func(t *testing.T) {
		p, err := admin.NewPurgePlan(east, []*api.Node{markedNode(east)}, append([]consul.Registered{unmarked, westMarked}, ours...), nil)
		if err != nil || len(p.Owned) != 2 || len(p.Foreign) != 2 || p.RemovesNode() {
			t.Fatalf("plan %+v, err %v", p, err)
		}
	})
	t.Run("a node-level check keeps the node", func(t *testing.T) {
		p, err := admin.NewPurgePlan(east, []*api.Node{markedNode(east)}, ours, api.HealthChecks{nodeCheck, serviceCheck})
		if err != nil || p.RemovesNode() || len(p.NodeChecks) != 1 || p.NodeChecks[0] != "serfHealth" {
			t.Fatalf("plan %+v, err %v", p, err)
		}
	})
	t.Run("no node: nothing to do", func(t *testing.T) {
		p, err := admin.NewPurgePlan(east, nil, nil, nil)
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
			n := &api.Node{Node: east.NodeName(), Meta: meta}
			if _, err := admin.NewPurgePlan(east, []*api.Node{n}, ours, nil); err == nil || !strings.Contains(err.Error(), "refusing to touch node k8s-east") {
				t.Errorf("meta %v: err %v", meta, err)
			}
		}
	})
}

func TestPurgeClaim(t *testing.T) {
	east := mustCluster(t, "east")
	claim := &claim.Value{ClusterID: "east", KubeUID: "uid-1", Holder: "pod-1"}
	cases := []struct {
		name         string
		plan         admin.PurgePlan
		refused      bool
		removesClaim bool
	}{
		{"held claim refuses", admin.PurgePlan{Cluster: east, NodeFound: true, Claim: claim, ClaimHeld: true}, true, false},
		{"released claim goes with the node", admin.PurgePlan{Cluster: east, NodeFound: true, Claim: claim}, false, true},
		{"released claim stays while the node stays", admin.PurgePlan{Cluster: east, NodeFound: true, Claim: claim, NodeChecks: []string{"c"}}, false, false},
		{"released claim of a cluster without node", admin.PurgePlan{Cluster: east, Claim: claim}, false, true},
		{"no claim", admin.PurgePlan{Cluster: east, NodeFound: true}, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.plan.Refusal()
			if (err != nil) != c.refused || (err != nil && !strings.Contains(err.Error(), `claimed by a running fleetsync (holder "pod-1"`)) {
				t.Errorf("refusal = %v, want refused %t", err, c.refused)
			}
			if got := c.plan.RemovesClaim(); got != c.removesClaim {
				t.Errorf("RemovesClaim = %t, want %t", got, c.removesClaim)
			}
		})
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
	nodes    map[string]*api.Node
	services map[string][]*api.AgentService
	checks   map[string]api.HealthChecks
	txns     []api.NodeOp
	calls    int
	before   func(f *fakeNodes, call string)
}

func newFakeNodes(nodes ...*api.Node) *fakeNodes {
	f := &fakeNodes{index: 10, nodes: map[string]*api.Node{}, services: map[string][]*api.AgentService{}, checks: map[string]api.HealthChecks{}}
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
func (f *fakeNodes) writeNode(n api.Node) *api.Node {
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
func (f *fakeNodes) register(n api.Node, id string) {
	f.writeNode(n)
	f.index++
	f.services[n.Node] = append(f.services[n.Node], &api.AgentService{ID: id, Service: "web", ModifyIndex: f.index})
}

func (f *fakeNodes) deleteNode(name string) {
	f.index++
	delete(f.nodes, name)
	delete(f.services, name)
	delete(f.checks, name)
}

func (f *fakeNodes) CatalogNode(name string, _ *api.QueryOptions) (*api.CatalogNode, *api.QueryMeta, error) {
	f.call("read")
	n := f.nodes[name]
	if n == nil {
		return nil, &api.QueryMeta{}, nil
	}
	c := *n
	out := &api.CatalogNode{Node: &c, Services: map[string]*api.AgentService{}}
	for _, s := range f.services[name] {
		out.Services[s.ID] = s
	}
	return out, &api.QueryMeta{}, nil
}

func (f *fakeNodes) HealthNode(name string, _ *api.QueryOptions) (api.HealthChecks, *api.QueryMeta, error) {
	f.call("checks")
	return f.checks[name], &api.QueryMeta{}, nil
}

func (f *fakeNodes) Txn(ops api.TxnOps, _ *api.QueryOptions) (bool, *api.TxnResponse, *api.QueryMeta, error) {
	if len(ops) != 1 || ops[0].Node == nil {
		return false, nil, nil, fmt.Errorf("fake: want one node op, got %d ops", len(ops))
	}
	op := ops[0].Node
	f.txns = append(f.txns, op.Verb)
	stale := &api.TxnResponse{Errors: api.TxnErrors{{OpIndex: 0, What: fmt.Sprintf("failed to set node %q, index is stale", op.Node.Node)}}}
	switch op.Verb {
	case api.NodeCAS:
		f.call("cas")
		have := f.nodes[op.Node.Node]
		if have == nil || have.ModifyIndex != op.Node.ModifyIndex {
			return false, stale, &api.QueryMeta{}, nil
		}
		n := f.writeNode(op.Node)
		return true, &api.TxnResponse{Results: api.TxnResults{{Node: n}}}, &api.QueryMeta{}, nil
	case api.NodeDeleteCAS:
		f.call("delete")
		have := f.nodes[op.Node.Node]
		if have == nil || have.ModifyIndex != op.Node.ModifyIndex {
			return false, stale, &api.QueryMeta{}, nil
		}
		f.deleteNode(op.Node.Node)
		return true, &api.TxnResponse{}, &api.QueryMeta{}, nil
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
		read    func(f *fakeNodes) *api.Node // the node as purge read it; default: as stored
		before  func(*fakeNodes, string)
		want    admin.NodeFate
		why     string       // substring of want.why
		txns    []api.NodeOp // sent, in order
		kept    bool         // the node is still there, without the fence
		service string       // a service that must still be there
	}{
		{
			name: "marked, empty, unchanged: fenced, then deleted",
			want: admin.NodeFate{Removed: true},
			txns: []api.NodeOp{api.NodeCAS, api.NodeDeleteCAS},
		},
		{
			name: "a node of our name without our mark: nothing sent",
			read: func(f *fakeNodes) *api.Node {
				n := *f.nodes[mark.Node]
				n.Meta = foreignMeta
				return &n
			},
			why: "refusing to touch node k8s-east", kept: true,
		},
		{
			name:   "changed after the read: left as it is",
			before: once("first", func(f *fakeNodes) { n := *mark; n.Address = "10.9.9.9"; f.writeNode(n) }),
			why:    "it changed after purge read it", txns: []api.NodeOp{api.NodeCAS}, kept: true,
		},
		{
			name: "replaced after the read by a foreign node of our name: left as it is",
			before: once("first", func(f *fakeNodes) {
				f.deleteNode(mark.Node)
				n := *mark
				n.Meta = foreignMeta
				f.register(n, "west-web")
			}),
			why: "it changed after purge read it", txns: []api.NodeOp{api.NodeCAS}, kept: true, service: "west-web",
		},
		{
			name:   "a service registered after the read, node index unchanged (as Consul does): seen by the last read",
			before: once("first", func(f *fakeNodes) { f.register(*mark, "by-hand") }),
			why:    "service web id by-hand registered on it after purge read it",
			txns:   []api.NodeOp{api.NodeCAS, api.NodeCAS}, kept: true, service: "by-hand",
		},
		{
			name:   "a service registered after the last read: the registration rewrites the fenced node, the delete fails",
			before: once("delete", func(f *fakeNodes) { f.register(*mark, "k8s_east_shop_web_10.0.0.1_80") }),
			why:    "written to while purge was deleting it",
			txns:   []api.NodeOp{api.NodeCAS, api.NodeDeleteCAS}, kept: true, service: "k8s_east_shop_web_10.0.0.1_80",
		},
		{
			name: "a node check registered after the read",
			before: once("first", func(f *fakeNodes) {
				f.checks[mark.Node] = api.HealthChecks{{Node: mark.Node, CheckID: "maint"}}
			}),
			why:  "node check maint registered on it after purge read it",
			txns: []api.NodeOp{api.NodeCAS, api.NodeCAS}, kept: true,
		},
		{
			name:   "deleted by someone else before the fence",
			before: once("first", func(f *fakeNodes) { f.deleteNode(mark.Node) }),
			want:   admin.NodeFate{Gone: true}, txns: []api.NodeOp{api.NodeCAS},
		},
		{
			name:   "deleted by someone else after the fence",
			before: once("read", func(f *fakeNodes) { f.deleteNode(mark.Node) }),
			want:   admin.NodeFate{Gone: true}, txns: []api.NodeOp{api.NodeCAS},
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
			got, err := admin.RemoveNode(context.Background(), f, east, &readCopy)
			if err != nil {
				t.Fatal(err)
			}
			if tt.why != "" {
				if got.Removed || got.Gone || !strings.Contains(got.Why, tt.why) {
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
			case tt.kept && n.Meta[admin.PurgeFenceMeta] != "":
				t.Errorf("node %s kept with the fence on: %v", mark.Node, n.Meta)
			case got.Removed && n != nil:
				t.Errorf("removed, but node %s is still there: %+v", mark.Node, n)
			}
			if tt.service != "" && len(f.services[mark.Node]) == 0 {
				t.Errorf("service %s deleted with the node", tt.service)
			}
		})
	}
}
