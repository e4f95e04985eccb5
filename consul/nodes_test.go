package consul

import (
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"
)

// TestNodeReadOlderThanACreateKeepsIt: a node read answered before one of
// our creates committed does not undo the create (the next node op would
// be a create-only CAS on a node that exists); a newer read is trusted.
func TestNodeReadOlderThanACreateKeepsIt(t *testing.T) {
	var r nodeRegistry
	r.set(nil, 40)
	r.written("k8s-a", 50, 50, "127.0.0.1", nil)
	r.set(nil, 45) // answered before the create
	if n, ok := r.nodes["k8s-a"]; !ok || n.ModifyIndex != 50 {
		t.Fatalf("an older read dropped the node we created: %+v %v", n, ok)
	}
	r.set(nil, 60) // answered after: the node is really gone
	if _, ok := r.nodes["k8s-a"]; ok {
		t.Fatal("a newer read without the node kept it")
	}
	r.written("k8s-a", 70, 70, "127.0.0.1", nil)
	r.forget()
	r.set(nil, 10) // after a loss: Consul's history starts again
	if _, ok := r.nodes["k8s-a"]; ok {
		t.Fatal("after forget, an old create outlived a fresh read")
	}
}

// TestNodeCreationsAreReservedAllOrNone: a transaction that needs a node
// another one is creating reserves nothing and waits, so two transactions
// creating two nodes in opposite orders never wait for each other.
func TestNodeCreationsAreReservedAllOrNone(t *testing.T) {
	var r nodeRegistry
	r.set(nil, 1)
	_, mine, wait := r.reserve([]string{"k8s-a", "k8s-b"})
	if wait != nil || len(mine) != 2 {
		t.Fatalf("first reservation: mine %v, wait %v", mine, wait)
	}
	_, mine2, wait2 := r.reserve([]string{"k8s-b", "k8s-c"})
	if wait2 == nil || len(mine2) != 0 {
		t.Fatalf("second reservation while b is being created: mine %v, wait %v", mine2, wait2)
	}
	if _, busy := r.creating["k8s-c"]; busy {
		t.Fatal("the waiting transaction reserved k8s-c")
	}
	r.written("k8s-b", 5, 5, "127.0.0.1", nil)
	r.created(mine)
	select {
	case <-wait2:
	default:
		t.Fatal("the waiter was not woken when the creation ended")
	}
	entries, mine2, wait2 := r.reserve([]string{"k8s-b", "k8s-c"})
	if wait2 != nil || len(mine2) != 1 || mine2[0] != "k8s-c" || entries[0].ModifyIndex != 5 {
		t.Fatalf("after the creation: entries %+v mine %v wait %v", entries, mine2, wait2)
	}
}

// TestFailedGuardKeepsTheFailedNodeOp: a transaction whose claim check and
// node op both failed (Consul came back empty) reports both, so the nodes
// are read again before the retry.
func TestFailedGuardKeepsTheFailedNodeOp(t *testing.T) {
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: "claim"}},
		{Node: &api.NodeTxnOp{Verb: api.NodeCAS, Node: api.Node{Node: "k8s-a"}}},
	}
	te := &TxnError{Errors: []api.TxnError{{OpIndex: 0, What: "key doesn't exist"}, {OpIndex: 1, What: "index is stale"}}}
	te.locate(ops, 1, 0, 1, nil)
	if !te.Guard || len(te.Nodes) != 1 || te.Nodes[0] != "k8s-a" || !te.Conflict {
		t.Fatalf("located %+v: want the guard, node k8s-a and a conflict", te)
	}
}

// TestWitnesses: a committed write is a witness, read back at its index;
// writes closer together than witnessEvery keep the first; our own delete
// retires one; an entry someone else removed (or a restore undid) reads as
// gone.
func TestWitnesses(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "witness"}
	c := NewClient(a.Client, owner, Options{})
	if ws := c.Witnesses(); len(ws) != 0 {
		t.Fatalf("witnesses before any write: %+v", ws)
	}
	first, second := owner.instance(0, "wit"), owner.instance(1, "wit")
	applied, err := c.Apply(ctx, Change{Register: []Instance{first}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, Change{Register: []Instance{second}}); err != nil {
		t.Fatal(err)
	}
	third := owner.instance(2, "wit")
	if _, err := c.Apply(ctx, Change{Register: []Instance{third}}); err != nil {
		t.Fatal(err)
	}
	// The first write, and the newest: the second, within witnessEvery of
	// the first, was replaced by the third.
	ws := c.Witnesses()
	if len(ws) != 2 || ws[0].ID != first.ID || ws[0].Name != "wit" || ws[0].Node != "k8s-witness" || ws[0].Index != applied.Written[0].ServiceIndex || ws[1].ID != third.ID {
		t.Fatalf("witnesses %+v, want %s at %d and %s (the writes came within %s)", ws, first.ID, applied.Written[0].ServiceIndex, third.ID, witnessEvery)
	}
	w := ws[0]
	if r, err := c.ReadWitness(ctx, w); err != nil || !r.Found || !r.Ours || r.Index != w.Index || w.CheckIndex == 0 || r.CheckIndex != w.CheckIndex {
		t.Fatalf("ReadWitness: %+v %v, want ours at %d, its check at %d (not 0)", r, err, w.Index, w.CheckIndex)
	}
	// Removed behind our back: gone, and still a witness.
	if _, err := a.Client.Catalog().Deregister(&api.CatalogDeregistration{Node: w.Node, ServiceID: w.ID}, nil); err != nil {
		t.Fatal(err)
	}
	if r, err := c.ReadWitness(ctx, w); err != nil || r.Found || !c.IsWitness(w) {
		t.Fatalf("ReadWitness of a removed entry: %+v, %v; standing %v", r, err, c.IsWitness(w))
	}
	// Our own delete retires it; the delete is the entry's witness now:
	// gone, until someone (a restore) brings the entry back.
	if _, err := c.Apply(ctx, Change{Register: []Instance{first}}); err != nil {
		t.Fatal(err)
	}
	cur, _, err := c.ReadService(ctx, "wit")
	if err != nil {
		t.Fatal(err)
	}
	var gone Registered
	for _, r := range cur {
		if r.ID == first.ID {
			gone = r
			if _, err := c.Apply(ctx, Change{Deregister: []Registered{r}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	i := slices.IndexFunc(c.Witnesses(), func(o Witness) bool { return o.ID == first.ID })
	if c.IsWitness(w) || i < 0 || !c.Witnesses()[i].Deleted {
		t.Fatalf("after our delete, witnesses %+v, want %s's delete", c.Witnesses(), first.ID)
	}
	del := c.Witnesses()[i]
	// Above the entry's own indexes, even when it was our latest write
	// (as here): a restore brings it back at exactly them (the review's
	// finding: a delete witness at the entry's own index took the entry
	// back for someone's later write).
	if del.Index <= max(gone.ServiceIndex, gone.CheckIndex) {
		t.Fatalf("our delete's witness says it committed at index %d or later, not above the entry's own %d/%d", del.Index, gone.ServiceIndex, gone.CheckIndex)
	}
	if r, err := c.ReadWitness(ctx, del); err != nil || r.Found {
		t.Fatalf("ReadWitness of our delete: %+v, %v", r, err)
	}
	if _, err := a.Client.Catalog().Register(&api.CatalogRegistration{Node: del.Node, Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &api.AgentService{ID: del.ID, Service: del.Name, Port: 1}}, nil); err != nil {
		t.Fatal(err)
	}
	// Someone else's (no mark) reads as theirs.
	if r, err := c.ReadWitness(ctx, del); err != nil || !r.Found || r.Ours || !c.IsWitness(del) {
		t.Fatalf("ReadWitness of someone else's entry under our deleted ID: %+v, %v; standing %v", r, err, c.IsWitness(del))
	}
	// A Service this process stops syncing witnesses nothing.
	c.ForgetWitnesses("witness-wit-")
	if ws := c.Witnesses(); slices.ContainsFunc(ws, func(o Witness) bool { return o.ID == third.ID }) {
		t.Fatalf("ForgetWitnesses left %+v", ws)
	}
	c.ResetCommitted()
	if ws := c.Witnesses(); len(ws) != 0 {
		t.Fatalf("witnesses survived ResetCommitted: %+v", ws)
	}
}

// TestKVIndexOfAMissingKeyIsTheTables: the KV index read on a key nobody
// writes moves with every KV write (Consul answers a missing key with the
// whole table's index), which the loss detector's restore signal relies on.
func TestKVIndexOfAMissingKeyIsTheTables(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	c := NewClient(a.Client, testOwner{id: "kvindex"}, Options{})
	probe := "fleetsync/clusters/kvindex.index-probe"
	before, err := c.KVIndex(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client.KV().Put(&api.KVPair{Key: "someone/else/key", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	written, _, err := a.Client.KV().Get("someone/else/key", nil)
	if err != nil || written == nil {
		t.Fatalf("read back: %v", err)
	}
	after, err := c.KVIndex(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	if after <= before || after < written.ModifyIndex {
		t.Fatalf("KV index of the missing key %d -> %d after a write at %d elsewhere in KV: it does not follow the table", before, after, written.ModifyIndex)
	}
}
