package worker

import (
	"strings"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// TestInstanceStaysWhenItsNewNodeHoldsAForeignEntry: after --consul-nodes
// changed, an instance of ours is on its old node and someone else's entry
// holds its ID on the new one: it stays where it is (a move would fail
// every flush of the Service), everything else moves as usual.
func TestInstanceStaysWhenItsNewNodeHoldsAForeignEntry(t *testing.T) {
	cfg := testConfig(t)
	spread, err := cfg.Cluster.WithNodes(16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cluster = spread
	id := spread.InstanceID(testKey.Namespace, testKey.Name, "10.0.0.1", 8080)
	home := spread.NodeNameFor(id)
	if home == spread.NodeName() {
		t.Fatalf("test needs an ID whose home is not the first node")
	}
	want := spread.Stamp(consul.Instance{ID: id, Name: testName, Address: "10.0.0.1", Port: 8080,
		Meta: map[string]string{MetaNamespace: testKey.Namespace, MetaService: testKey.Name}, Check: consul.Check{Status: consul.StatusPassing}})
	w := New(Options{Key: testKey, Config: cfg, Lookup: func() (*k8s.Service, bool) { return nil, false }, Store: newFakeStore(t, spread)})
	w.owned = map[string]Held{id: Hold(consul.Registered{Instance: want, Node: spread.NodeName(), ServiceIndex: 10, HasCheck: true})}
	if ch := Diff([]consul.Instance{want}, w.owned, w.nodeOf, w.mark); len(ch.Register) != 1 {
		t.Fatalf("without a foreign entry the instance moves home: %+v", ch)
	}
	w.foreign = map[string]consul.Registered{id: {Instance: consul.Instance{ID: id, Name: testName, Tags: []string{"theirs"}}, Node: home, ServiceIndex: 20}}
	if ch := Diff([]consul.Instance{want}, w.owned, w.nodeOf, w.mark); !ch.Empty() {
		t.Fatalf("moved onto a node where someone else's entry holds the ID: %+v", ch)
	}
}

// TestLossEvidence: entries gone or older than written are evidence; an
// entry that someone re-registered under our ID is not.
func TestLossEvidence(t *testing.T) {
	reg := func(id string, index uint64) Held {
		return Held{ID: id, ServiceIndex: index}
	}
	held := map[string]Held{"a": reg("a", 10), "b": reg("b", 20), "c": reg("c", 30)}
	foreign := func(id string, index uint64) consul.Registered {
		return consul.Registered{Instance: consul.Instance{ID: id}, ServiceIndex: index}
	}
	for _, tc := range []struct {
		name    string
		now     map[string]Held
		foreign map[string]consul.Registered
		want    string // substring; "" means no evidence
	}{
		{"unchanged", map[string]Held{"a": reg("a", 10), "b": reg("b", 20), "c": reg("c", 30)}, nil, ""},
		{"changed by us since", map[string]Held{"a": reg("a", 11), "b": reg("b", 20), "c": reg("c", 30)}, nil, ""},
		{"older than written", map[string]Held{"a": reg("a", 10), "b": reg("b", 15), "c": reg("c", 30)}, nil, "1 of 3 entries older"},
		{"gone", map[string]Held{"a": reg("a", 10)}, nil, "2 gone"},
		{"re-registered by someone else", map[string]Held{"a": reg("a", 10), "b": reg("b", 20)}, map[string]consul.Registered{"c": foreign("c", 40)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := lossEvidence(held, tc.now, tc.foreign)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("evidence %q, want %q", got, tc.want)
			}
		})
	}
}
