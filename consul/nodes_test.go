package consul

import (
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
	te.locate(ops, 1, 1, nil)
	if !te.Guard || len(te.Nodes) != 1 || te.Nodes[0] != "k8s-a" || !te.Conflict {
		t.Fatalf("located %+v: want the guard, node k8s-a and a conflict", te)
	}
}
