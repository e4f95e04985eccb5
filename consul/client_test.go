package consul

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/consultest"
)

// TestApplyAgainstConsul drives one instance set through create, update,
// check-only update, stale CAS and delete against a real agent.
func TestApplyAgainstConsul(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "applytest"}
	var txns int
	c := NewClient(a.Client, owner, Options{Observe: func(ops int, _ float64, err error) {
		if err == nil {
			txns++
		}
	}})

	// 300 instances: 2 ops each plus the node op, at most 128 ops per txn,
	// so 63 instances per transaction and 5 transactions.
	var ins []Instance
	for i := range 300 {
		ins = append(ins, owner.instance(i, "apply"))
	}
	before, _ := a.RaftApplies()
	applied, err := c.Apply(ctx, Change{Register: ins})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := a.RaftApplies()
	if applied.Txns != 5 || applied.Registered != 300 || txns != 5 || after-before != 5 {
		t.Fatalf("300 registrations: %d txns (observed %d, raft applies %v), %d registered; want 5, 5, 5, 300",
			applied.Txns, txns, after-before, applied.Registered)
	}
	read, err := c.ReadNode(ctx)
	if err != nil || len(read) != 300 {
		t.Fatalf("ReadNode: %d entries, %v", len(read), err)
	}
	byID := map[string]Registered{}
	for _, r := range read {
		byID[r.ID] = r
	}
	for _, w := range applied.Written {
		r := byID[w.ID]
		if !r.Instance.Equal(w.Instance) || r.ServiceIndex != w.ServiceIndex || r.CheckIndex != w.CheckIndex || !r.HasCheck {
			t.Fatalf("written %+v differs from read %+v", w, r)
		}
	}

	// Update tags of one, status of another: one transaction, CAS on the
	// read indexes; the returned indexes match Consul's.
	r0, r1 := byID[ins[0].ID], byID[ins[1].ID]
	w0 := r0.Instance
	w0.Tags = []string{"k8s", "v2", owner.id}
	w1 := r1.Instance
	w1.Check = Check{Status: StatusWarning, Output: "terminating"}
	applied, err = c.Apply(ctx, Change{Update: []Update{{Want: w0, Have: r0}, {Want: w1, Have: r1}}})
	if err != nil || applied.Txns != 1 || applied.Updated != 2 {
		t.Fatalf("update: %+v, %v", applied, err)
	}
	prefix, err := c.ReadPrefix(ctx, ins[1].ID) // also matches -10, -11, ...
	if err != nil || len(prefix) != 111 {
		t.Fatalf("ReadPrefix(%s): %d entries, %v; want 111", ins[1].ID, len(prefix), err)
	}
	for _, r := range prefix {
		if r.ID == ins[1].ID && (r.Check.Status != StatusWarning || r.ServiceIndex != r1.ServiceIndex) {
			t.Fatalf("check-only update: status %s, service index %d (must stay %d)", r.Check.Status, r.ServiceIndex, r1.ServiceIndex)
		}
	}

	// Stale index: a CAS conflict, and the entry is untouched.
	stale := r0 // holds the index from before the update
	w0.Tags = []string{"k8s", "v3", owner.id}
	_, err = c.Apply(ctx, Change{Update: []Update{{Want: w0, Have: stale}}})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("stale update: err = %v, want ErrConflict", err)
	}
	_, err = c.Apply(ctx, Change{Deregister: []Registered{stale}})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("stale delete: err = %v, want ErrConflict", err)
	}
	// Create of an ID that exists: conflict, never an overwrite.
	_, err = c.Apply(ctx, Change{Register: []Instance{ins[2]}})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("create over an existing entry: err = %v, want ErrConflict", err)
	}

	// Delete everything with the read indexes.
	read, _ = c.ReadNode(ctx)
	applied, err = c.Apply(ctx, Change{Deregister: read})
	if err != nil || applied.Deregistered != 300 {
		t.Fatalf("deregister: %+v, %v", applied, err)
	}
	if read, _ = c.ReadNode(ctx); len(read) != 0 {
		t.Fatalf("%d entries left", len(read))
	}
}

// TestOwnershipIsEnforcedBeforeSending: unstamped writes and deletes of
// entries that are not ours are refused without a request.
func TestOwnershipIsEnforcedBeforeSending(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner := testOwner{id: "refuse"}
	c := NewClient(twin.Client(), owner, Options{})

	// Someone else's entry, registered by hand on another node.
	_, err := twin.Client().Catalog().Register(&api.CatalogRegistration{Node: "other", Address: "127.0.0.2",
		Service: &api.AgentService{ID: "foreign-1", Service: "web", Port: 80, Tags: []string{owner.id}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign := Registered{Instance: Instance{ID: "foreign-1", Name: "web", Tags: []string{owner.id},
		Meta: map[string]string{"k8s-cluster": owner.id}}, Node: "other", ServiceIndex: 1}
	unstamped := owner.instance(1, "web")
	unstamped.Meta = nil

	before := twin.Txns()
	for name, ch := range map[string]Change{
		"delete foreign":      {Deregister: []Registered{foreign}},
		"update foreign":      {Update: []Update{{Want: owner.instance(1, "web"), Have: foreign}}},
		"register unstamped":  {Register: []Instance{unstamped}},
		"mixed with good ops": {Register: []Instance{owner.instance(2, "web"), unstamped}},
	} {
		if _, err := c.Apply(ctx, ch); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: err = %v, want ErrRefused", name, err)
		}
	}
	if after := twin.Txns(); after != before {
		t.Errorf("refused changes sent %d transactions", after-before)
	}
	if svcs := twin.Services("other"); len(svcs) != 1 || svcs[0].ID != "foreign-1" || twin.Services(owner.Node().Name) != nil {
		t.Errorf("catalog after refusals: %+v on other, %+v on ours", svcs, twin.Services(owner.Node().Name))
	}
}

func TestReadOfAbsentNodeIsEmpty(t *testing.T) {
	a := needConsul(t)
	c := NewClient(a.Client, testOwner{id: "nobody"}, Options{})
	got, err := c.ReadNode(context.Background())
	if err != nil || len(got) != 0 {
		t.Fatalf("ReadNode of an absent node: %v, %v", got, err)
	}
}

// TestSpreadOverNodes: an owner with two nodes gets both in
// one transaction (a node op each), and every read (node, prefix, service,
// node existence) sees the instances of both; a foreign node with a name
// close to ours is not read.
func TestSpreadOverNodes(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner := testOwner{id: "spreadtest", spread: true}
	c := NewClient(twin.Client(), owner, Options{})
	var ins []Instance
	for i := range 10 {
		ins = append(ins, owner.instance(i, "spread"))
	}
	applied, err := c.Apply(ctx, Change{Register: ins})
	if err != nil {
		t.Fatal(err)
	}
	if applied.Txns != 1 || applied.Ops != 2+10*2 {
		t.Fatalf("10 instances on 2 nodes: %d txns, %d ops; want 1 txn of 22 ops (2 node ops)", applied.Txns, applied.Ops)
	}
	// Someone else's node with our node meta and a look-alike name.
	if _, err := twin.Client().Catalog().Register(&api.CatalogRegistration{Node: "k8s-spreadtest-1", Address: "127.0.0.1",
		NodeMeta: owner.Node().Meta, Service: &api.AgentService{ID: "spreadtest-spread-99", Service: "spread"}}, nil); err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0] != "k8s-spreadtest" || nodes[1] != "k8s-spreadtest.1" {
		t.Fatalf("Nodes = %v, %v; want k8s-spreadtest and k8s-spreadtest.1", nodes, err)
	}
	onNode := map[string]int{}
	for _, w := range applied.Written {
		onNode[w.Node]++
		if w.Node != owner.NodeNameFor(w.ID) {
			t.Errorf("%s written on %s, want %s", w.ID, w.Node, owner.NodeNameFor(w.ID))
		}
	}
	if onNode["k8s-spreadtest"] != 5 || onNode["k8s-spreadtest.1"] != 5 {
		t.Fatalf("instances per node %v, want 5 and 5", onNode)
	}
	for what, read := range map[string]func() ([]Registered, error){
		"ReadNode":    func() ([]Registered, error) { return c.ReadNode(ctx) },
		"ReadPrefix":  func() ([]Registered, error) { return c.ReadPrefix(ctx, "spreadtest-spread-") },
		"ReadService": func() ([]Registered, error) { r, _, err := c.ReadService(ctx, "spread"); return r, err },
	} {
		got, err := read()
		if err != nil || len(got) != 10 {
			t.Fatalf("%s: %d entries, %v; want the 10 on our two nodes", what, len(got), err)
		}
		for _, r := range got {
			if r.Node != owner.NodeNameFor(r.ID) || !r.HasCheck {
				t.Errorf("%s: %s read on %s (check %t)", what, r.ID, r.Node, r.HasCheck)
			}
		}
	}
	// Updates stay on the node the entry is on; deletes go to it.
	read, _ := c.ReadNode(ctx)
	var ch Change
	for _, r := range read {
		if r.ID == ins[1].ID {
			w := r.Instance
			w.Check = Check{Status: StatusCritical, Output: "not ready"}
			ch.Update = append(ch.Update, Update{Want: w, Have: r})
		} else {
			ch.Deregister = append(ch.Deregister, r)
		}
	}
	if _, err := c.Apply(ctx, ch); err != nil {
		t.Fatal(err)
	}
	got, _, err := c.ReadService(ctx, "spread")
	if err != nil || len(got) != 1 || got[0].Node != "k8s-spreadtest.1" || got[0].Check.Status != StatusCritical {
		t.Fatalf("after the update and 9 deletes: %+v, %v", got, err)
	}
	if view, err := c.ReadNodes(ctx); err != nil || len(view.Nodes) != 2 || len(view.Foreign()) != 0 {
		t.Fatalf("ReadNodes = %+v, %v; want our two nodes", view, err)
	}

	// A move: an instance written on the first node (one node then) that
	// belongs on the second now is deleted there and registered here in one
	// group, so in one transaction.
	single := NewClient(twin.Client(), testOwner{id: owner.id}, Options{})
	odd := owner.instance(11, "moving")
	if _, err := single.Apply(ctx, Change{Register: []Instance{odd}}); err != nil {
		t.Fatal(err)
	}
	before, _, err := c.ReadService(ctx, "moving")
	if err != nil || len(before) != 1 || before[0].Node != "k8s-spreadtest" {
		t.Fatalf("before the move: %+v, %v", before, err)
	}
	moved, err := c.Apply(ctx, Change{Deregister: before, Register: []Instance{odd}})
	if err != nil || moved.Txns != 1 || moved.Registered != 1 || moved.Deregistered != 1 || len(moved.Written) != 1 || moved.Written[0].Node != "k8s-spreadtest.1" {
		t.Fatalf("move: %+v, %v; want one transaction writing it on k8s-spreadtest.1", moved, err)
	}
	after, _, err := c.ReadService(ctx, "moving")
	if err != nil || len(after) != 1 || after[0].Node != "k8s-spreadtest.1" || after[0].ServiceIndex != moved.Written[0].ServiceIndex {
		t.Fatalf("after the move: %+v, %v", after, err)
	}
}

// TestWeightRoundTrip: an instance's Weight is written as Weights.Passing
// and read back as written, and an instance without one reads back as 0
// (Consul's default), so the diff sees no change and writes nothing.
func TestWeightRoundTrip(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "weighttest"}
	c := NewClient(a.Client, owner, Options{})
	heavy, plain := owner.instance(0, "weight"), owner.instance(1, "weight")
	heavy.Weight = 5
	if _, err := c.Apply(ctx, Change{Register: []Instance{heavy, plain}}); err != nil {
		t.Fatal(err)
	}
	read, err := c.ReadNode(ctx)
	if err != nil || len(read) != 2 {
		t.Fatalf("ReadNode: %d entries, %v", len(read), err)
	}
	for _, r := range read {
		want := map[string]Instance{heavy.ID: heavy, plain.ID: plain}[r.ID]
		if !r.Instance.Equal(want) {
			t.Errorf("read %+v, want %+v", r.Instance, want)
		}
	}
	entries, _, err := a.Client.Catalog().Service(heavy.Name, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		if e.ServiceID == heavy.ID {
			found = true
			if e.ServiceWeights.Passing != 5 || e.ServiceWeights.Warning != 1 {
				t.Errorf("weights in Consul %+v, want passing 5, warning 1", e.ServiceWeights)
			}
		}
	}
	if !found {
		t.Errorf("%s not in the catalog", heavy.ID)
	}
}

// TestChangeNamesTheNode: a change's NodeFor places its registrations
// (the worker's node layout, chosen at run time, wins over the owner's),
// and a node that is not the owner's is refused before anything is sent.
func TestChangeNamesTheNode(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner := testOwner{id: "nodefor"} // its own layout: everything on k8s-nodefor
	c := NewClient(twin.Client(), owner, Options{})
	second := func(string) string { return "k8s-nodefor.1" }
	applied, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(1, "placed"), owner.instance(2, "placed")}, NodeFor: second})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := c.ReadService(ctx, "placed")
	if err != nil || len(got) != 2 || got[0].Node != "k8s-nodefor.1" || got[1].Node != "k8s-nodefor.1" || applied.Txns != 1 {
		t.Fatalf("registered with NodeFor k8s-nodefor.1: %+v, %v (%d txns)", got, err, applied.Txns)
	}
	before := twin.Txns()
	for _, node := range []string{"k8s-other", "k8s-nodefor.2", "k8s-nodefor-1"} {
		_, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(3, "placed")}, NodeFor: func(string) string { return node }})
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), node) {
			t.Errorf("register on %s: err = %v, want ErrRefused naming the node", node, err)
		}
	}
	if after := twin.Txns(); after != before {
		t.Errorf("refused registrations sent %d transactions", after-before)
	}
}
