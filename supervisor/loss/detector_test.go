package loss

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
)

func nodeView(nodes ...consul.NodeEntry) consul.NodesView { return consul.NodesView{Nodes: nodes} }

func ours(name string, create uint64) consul.NodeEntry {
	return consul.NodeEntry{Name: name, CreateIndex: create, ModifyIndex: create, Ours: true}
}

// TestLossDetector: the rules that tell a Consul that lost or rolled back
// data from one that did not, each as a sequence of reads.
func TestLossDetector(t *testing.T) {
	type read struct {
		view      consul.NodesView
		index     map[string]uint64 // node index read
		committed map[string]uint64 // highest index our writes returned
	}
	for _, tc := range []struct {
		name  string
		reads []read
		want  []string // signals found at the last read
	}{
		{"quiet", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 40}, nil},
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 40}, map[string]uint64{"k8s-a": 40}},
		}, nil},
		{"writes raise the index", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 40}, nil},
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 90}, map[string]uint64{"k8s-a": 90}},
		}, nil},
		{"restarted empty, node not yet re-created", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 40}, nil},
			{nodeView(), nil, map[string]uint64{"k8s-a": 40}},
		}, []string{SignalNodeVanished}},
		{"restarted empty, a busy worker re-created the node", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 4000}, nil},
			{nodeView(ours("k8s-a", 12)), map[string]uint64{"k8s-a": 14}, map[string]uint64{"k8s-a": 14}},
		}, []string{SignalNodeRecreated, SignalIndexBack}},
		{"snapshot restored: index below the last read", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 400}, nil},
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 300}, nil},
		}, []string{SignalIndexBack}},
		{"snapshot restored: index below our last write", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 300}, nil},
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 300}, map[string]uint64{"k8s-a": 350}},
		}, []string{SignalIndexBack}},
		{"someone else's node is no sign", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 40}, nil},
			{nodeView(ours("k8s-a", 5), consul.NodeEntry{Name: "k8s-a.1", CreateIndex: 50}), map[string]uint64{"k8s-a": 40}, nil},
		}, nil},
		{"created and lost between two checks", []read{
			{nodeView(), nil, nil},
			{nodeView(), nil, map[string]uint64{"k8s-a": 18}},
		}, []string{SignalNodeVanished}},
		{"second node appears", []read{
			{nodeView(ours("k8s-a", 5)), map[string]uint64{"k8s-a": 40}, nil},
			{nodeView(ours("k8s-a", 5), ours("k8s-a.1", 60)), map[string]uint64{"k8s-a": 40, "k8s-a.1": 61}, map[string]uint64{"k8s-a.1": 61}},
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d detector
			var got []string
			for _, r := range tc.reads {
				got = nil
				var written []string
				for n := range r.committed {
					written = append(written, n)
				}
				for _, f := range d.checkNodes(r.view, written...) {
					got = append(got, f.Signal)
				}
				for _, n := range d.due() {
					for _, f := range d.checkIndex(n, r.index[n], r.committed[n]) {
						got = append(got, f.Signal)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("signals %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLossDetectorReadsManyNodesInTurn: with more nodes than one check
// reads, every node's index is read within a few checks.
func TestLossDetectorReadsManyNodesInTurn(t *testing.T) {
	var d detector
	var nodes []consul.NodeEntry
	for i := range 20 {
		nodes = append(nodes, ours(fmt.Sprintf("k8s-a.%d", i+1), 5))
	}
	d.checkNodes(nodeView(nodes...))
	seen := map[string]bool{}
	for range 3 {
		due := d.due()
		if len(due) != nodesPerCheck {
			t.Fatalf("%d nodes due, want %d", len(due), nodesPerCheck)
		}
		for _, n := range due {
			seen[n] = true
		}
	}
	if len(seen) != 20 {
		t.Fatalf("%d of 20 nodes read in 3 checks", len(seen))
	}
}

// committingStore commits a write on the node while its index is read:
// Consul answers the index from before the write, the write's result is
// recorded before the read returns.
type committingStore struct {
	index, committed uint64
}

func (c *committingStore) ReadNodes(context.Context) (consul.NodesView, error) {
	return consul.NodesView{}, nil
}
func (c *committingStore) NodeIndex(context.Context, string) (uint64, error) {
	before := c.index
	c.index += 5
	c.committed = c.index
	return before, nil
}
func (c *committingStore) Committed(string) uint64  { return c.committed }
func (c *committingStore) CommittedNodes() []string { return nil }
func (c *committingStore) ResetCommitted()          {}

// TestWriteDuringTheIndexReadIsNoLoss: a write committing while the node
// index is read is no sign of a rollback.
func TestWriteDuringTheIndexReadIsNoLoss(t *testing.T) {
	store := &committingStore{index: 100, committed: 100}
	var d detector
	view := nodeView(ours("k8s-a", 5))
	for i := range 5 {
		if found, _, _ := checkConsul(t.Context(), store, &d, view, nil); len(found) != 0 {
			t.Fatalf("check %d: %v with only our own writes landing", i, found)
		}
	}
}

// TestLossKeepsTheIndexesSeenBefore: a loss remembers the highest index
// seen before it (read, committed, the marks), for checkWitness; a later
// loss only raises it.
func TestLossKeepsTheIndexesSeenBefore(t *testing.T) {
	var d detector
	d.checkIndex("k8s-test", 500, 480)
	d.checkIndex("k8s-test.1", 690, 600)
	d.marks = consul.CatalogMarks{Nodes: 650, Checks: 695}
	d.reset(700)
	if d.reused != 700 || d.index != nil || d.marks.Known() {
		t.Fatalf("after a loss: reused %d (want 700), index %v, marks %+v", d.reused, d.index, d.marks)
	}
	d.checkIndex("k8s-test", 510, 0)
	d.reset(520)
	if d.reused != 700 {
		t.Fatalf("a later loss lowered reused to %d", d.reused)
	}
}
