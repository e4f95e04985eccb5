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
