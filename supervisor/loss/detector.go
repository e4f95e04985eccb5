package loss

import (
	"fmt"
	"sort"
	"time"

	"github.com/fleetsync/fleetsync/consul"
)

// nodesPerCheck bounds the node-index reads of one check; with more nodes
// they are read in turn.
const nodesPerCheck = 8

// detector decides from successive reads of the catalog whether Consul
// lost or rolled back data. It is pure: reads are passed in.
//
// A Consul that restarts empty, or is restored from an older snapshot,
// shows it in at least one way that no write of ours can hide: a node of
// ours is gone, or it was created again (its CreateIndex changed: a busy
// worker's first write after the loss re-creates it), or a node's catalog
// index is below what we saw or wrote (a restore takes every index back).
// A write landing between the fault and the next check can raise a node's
// index again; such a write is a CAS on entries the fault changed and
// fails, and the worker's re-read reports the loss itself (SignalWorker).
type detector struct {
	// marks are the catalog's marks, and committed the highest index our
	// writes had committed, at the start of a sweep of checks that read
	// every node's index, every read answered and nothing was found:
	// while both stand, nothing in the catalog moved since and we expect
	// nothing new of it, so a check has nothing to read
	// (consul.CatalogMarks). sweep is the sweep under way.
	marks     consul.CatalogMarks
	committed uint64
	sweep     marksSweep
	nodes     map[string]consul.NodeEntry // ours, at the last check
	index     map[string]uint64           // per node: the last catalog index read
	kv        uint64                      // the highest KV index read (StateKey)
	turn      int                         // where the next index reads start (in turn)
	// reused is the highest Consul index this process had seen when it
	// last found a loss: Consul that lost its last writes hands their
	// indexes out again, so an entry at an index up to this one may be an
	// older write than one at a lower index (see checkWitness). Never
	// reset.
	reused uint64
	// since is when the last check whose witness reads all answered
	// began: the next check reads every witness from then on, and the
	// newest one from before (see checkWitnesses).
	since time.Time
}

// nodes checks a fresh node list against the last one; it returns the
// findings and records the list.
func (d *detector) checkNodes(view consul.NodesView, written ...string) []Finding {
	var out []Finding
	now := map[string]consul.NodeEntry{}
	for _, n := range view.Nodes {
		if !n.Ours {
			continue
		}
		now[n.Name] = n
		if prev, ok := d.nodes[n.Name]; ok && prev.CreateIndex != n.CreateIndex {
			out = append(out, Finding{SignalNodeRecreated, fmt.Sprintf("node %s was created again (create index %d, was %d)", n.Name, n.CreateIndex, prev.CreateIndex)})
		}
	}
	gone := map[string]bool{}
	for name := range d.nodes {
		gone[name] = true
	}
	for _, name := range written {
		gone[name] = true
	}
	names := make([]string, 0, len(gone))
	for name := range gone {
		if _, ok := now[name]; !ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		out = append(out, Finding{SignalNodeVanished, fmt.Sprintf("node %s is gone", name)})
	}
	d.nodes = now
	return out
}

// due returns the nodes whose index the next check reads: all of them, or
// nodesPerCheck in turn.
func (d *detector) due() []string {
	names := make([]string, 0, len(d.nodes))
	for n := range d.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) <= nodesPerCheck {
		return names
	}
	out := make([]string, 0, nodesPerCheck)
	for i := range nodesPerCheck {
		out = append(out, names[(d.turn+i)%len(names)])
	}
	d.turn = (d.turn + nodesPerCheck) % len(names)
	return out
}

// checkIndex compares one node's index with the last one read and the
// highest one written.
func (d *detector) checkIndex(node string, index, committed uint64) []Finding {
	if d.index == nil {
		d.index = map[string]uint64{}
	}
	floor := max(d.index[node], committed)
	d.index[node] = index
	if index < floor {
		return []Finding{{SignalIndexBack, fmt.Sprintf("the catalog index of node %s went back to %d from %d", node, index, floor)}}
	}
	return nil
}

// reset starts a new history after a loss: what was just read is the
// new normal. committed is the highest index our writes had committed;
// the highest index seen so far is kept as reused.
func (d *detector) reset(committed uint64) {
	d.reused = max(d.reused, committed, d.kv, d.marks.Nodes, d.marks.Checks, d.sweep.marks.Nodes, d.sweep.marks.Checks)
	for _, i := range d.index {
		d.reused = max(d.reused, i)
	}
	d.index = nil
	d.kv = 0
	d.marks, d.committed, d.sweep = consul.CatalogMarks{}, 0, marksSweep{}
}

// marksSweep is a sweep of checks under the same marks and committed
// index: the nodes whose index it read.
type marksSweep struct {
	marks     consul.CatalogMarks
	committed uint64
	read      map[string]bool
}

// settle records a check begun under marks and committed. A check with a
// read that got no answer starts the sweep over; once the sweep has read
// every node of ours, the marks are the ones a check may skip on.
func (d *detector) settle(marks consul.CatalogMarks, committed uint64, complete bool, read []string) {
	if !complete || !marks.Known() {
		d.sweep = marksSweep{}
		return
	}
	if d.sweep.read == nil || d.sweep.marks != marks || d.sweep.committed != committed {
		d.sweep = marksSweep{marks: marks, committed: committed, read: map[string]bool{}}
	}
	for _, n := range read {
		d.sweep.read[n] = true
	}
	for n := range d.nodes {
		if !d.sweep.read[n] {
			return
		}
	}
	d.marks, d.committed = marks, committed
}

// committedMax is the highest index a write of ours committed at.
func committedMax(nw NodeWatcher) uint64 {
	var m uint64
	for _, node := range nw.CommittedNodes() {
		m = max(m, nw.Committed(node))
	}
	return m
}

// checkKV records a read of the KV index; an index below the highest
// read means Consul's state went back (a snapshot restore, or a Consul
// that lost its data).
func (d *detector) checkKV(index uint64) []Finding {
	var out []Finding
	if index < d.kv {
		out = append(out, Finding{SignalIndexBack, fmt.Sprintf("Consul's KV index went back to %d from %d: its state was replaced (a snapshot restore?)", index, d.kv)})
	}
	d.kv = max(d.kv, index)
	return out
}
