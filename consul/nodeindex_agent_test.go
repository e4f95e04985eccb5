package consul

import (
	"testing"

	"github.com/hashicorp/consul/api"
)

// TestServiceIndexMovesWithEveryWriteOfTheService pins what the
// anti-entropy gate stands on, on a real agent: any write of a service or
// check of a name, on any node, by anyone, raises that name's index
// (ServiceIndex, and the index ReadService answers), and a write of
// another name does not. (A node's own index, NodeIndex, does not move
// with check writes: it cannot be the gate.)
func TestServiceIndexMovesWithEveryWriteOfTheService(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "svcidx", spread: true}
	c := NewClient(a.Client, owner, Options{})
	ins := []Instance{owner.instance(2, "web"), owner.instance(4, "web"), owner.instance(1, "web"), owner.instance(3, "api")}
	if _, err := c.Apply(ctx, Change{Register: ins}); err != nil {
		t.Fatal(err)
	}
	node := owner.Node().Name
	index := func(name string) uint64 {
		t.Helper()
		i, err := c.ServiceIndex(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		_, j, err := c.ReadService(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if i != j || i == 0 {
			t.Fatalf("%s: ServiceIndex %d, ReadService's index %d", name, i, j)
		}
		return i
	}
	cat := a.Client.Catalog()
	register := func(r *api.CatalogRegistration) func() error {
		return func() error { _, err := cat.Register(r, nil); return err }
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"a service edited", register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
			Service: &api.AgentService{ID: ins[0].ID, Service: "web", Address: "10.9.9.9", Port: 80, Tags: ins[0].Tags, Meta: ins[0].Meta}})},
		{"a check's status changed", register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
			Check: &api.AgentCheck{Node: node, CheckID: CheckID(ins[1].ID), Name: "x", Status: api.HealthCritical, ServiceID: ins[1].ID}})},
		{"a check deleted", func() error {
			_, err := cat.Deregister(&api.CatalogDeregistration{Node: node, CheckID: CheckID(ins[1].ID)}, nil)
			return err
		}},
		{"a service deleted", func() error {
			_, err := cat.Deregister(&api.CatalogDeregistration{Node: node, ServiceID: ins[1].ID}, nil)
			return err
		}},
		{"an instance of the name added on someone else's node", register(&api.CatalogRegistration{Node: "elsewhere", Address: "10.1.1.1",
			Service: &api.AgentService{ID: "theirs", Service: "web", Port: 8080}})},
	}
	for _, s := range steps {
		before, other := index("web"), index("api")
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if after := index("web"); after <= before {
			t.Errorf("%s: the index of web stayed at %d (was %d)", s.what, after, before)
		}
		if after := index("api"); after != other {
			t.Errorf("%s: the index of api moved from %d to %d", s.what, other, after)
		}
	}
}

// TestNodeIndexMovesWithARename: one of our entries re-registered under
// another Consul name (same ID, same node) leaves the index of our name
// where it was (Consul raises only the new name's), and moves the node's
// (NodeIndex): the anti-entropy gate must compare both.
func TestNodeIndexMovesWithARename(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "rename"}
	c := NewClient(a.Client, owner, Options{})
	ins := []Instance{owner.instance(2, "web"), owner.instance(4, "web")}
	if _, err := c.Apply(ctx, Change{Register: ins}); err != nil {
		t.Fatal(err)
	}
	node := owner.Node().Name
	name0, err := c.ServiceIndex(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	node0, err := c.NodeIndex(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client.Catalog().Register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &api.AgentService{ID: ins[0].ID, Service: "other", Address: ins[0].Address, Port: ins[0].Port, Tags: ins[0].Tags, Meta: ins[0].Meta}}, nil); err != nil {
		t.Fatal(err)
	}
	name1, err := c.ServiceIndex(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	node1, err := c.NodeIndex(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := c.ReadService(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("web holds %d entries after the rename, want 1", len(got))
	}
	if name1 != name0 {
		t.Logf("Consul now raises the old name's index on a rename (%d -> %d): the node index is then a second signal", name0, name1)
	}
	if node1 <= node0 {
		t.Errorf("the node's index stayed at %d (was %d) after one of its services was renamed", node1, node0)
	}
}

// TestACheckOnAnotherServiceIsNotOurs: our check's ID registered on
// another service (someone else's) is not read as our instance's check,
// by the node read or the read by name: the instance reads as having none.
func TestACheckOnAnotherServiceIsNotOurs(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "movedcheck"}
	c := NewClient(a.Client, owner, Options{})
	ins := []Instance{owner.instance(2, "web"), owner.instance(4, "api")}
	if _, err := c.Apply(ctx, Change{Register: ins}); err != nil {
		t.Fatal(err)
	}
	node := owner.Node().Name
	if _, err := a.Client.Catalog().Register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
		Check: &api.AgentCheck{Node: node, CheckID: CheckID(ins[0].ID), Name: "moved", Status: api.HealthPassing, ServiceID: ins[1].ID}}, nil); err != nil {
		t.Fatal(err)
	}
	byNode, err := c.ReadNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName, _, err := c.ReadService(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	for how, got := range map[string][]Registered{"node read": byNode, "read by name": byName} {
		for _, r := range got {
			if r.ID == ins[0].ID && r.HasCheck {
				t.Errorf("%s: %s has a check (%+v), but its check ID is on %s", how, r.ID, r.Check, ins[1].ID)
			}
		}
	}
}
