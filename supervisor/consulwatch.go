package supervisor

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/worker"
)

// NodeWatcher is the part of the Store that describes the cluster's nodes
// in the catalog (consul.Client).
type NodeWatcher interface {
	// ReadNodes lists every node named like ours, ours or not.
	ReadNodes(ctx context.Context) (consul.NodesView, error)
	// NodeIndex is a node's catalog index: it only goes down when Consul
	// lost or rolled back data.
	NodeIndex(ctx context.Context, node string) (uint64, error)
	// Committed is the highest index a committed write returned for an
	// entry on node.
	Committed(node string) uint64
	// CommittedNodes names the nodes with a committed write since the
	// start or the last ResetCommitted.
	CommittedNodes() []string
	// ResetCommitted forgets the committed indexes (history restarted).
	ResetCommitted()
}

// Loss signals, the label of fleetsync_consul_data_loss_detected_total.
const (
	SignalNodeVanished  = "node_vanished"
	SignalNodeRecreated = "node_recreated"
	SignalIndexBack     = "index_went_back"
	SignalEntryLost     = "entry_lost"
	SignalWorker        = "worker_evidence"
)

// nodesPerCheck bounds the node-index reads of one check; with more nodes
// they are read in turn.
const nodesPerCheck = 8

// lossDetector decides from successive reads of the catalog whether Consul
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
type lossDetector struct {
	// marks are the catalog's marks, and committed the highest index our
	// writes had committed, at the start of a round of checks that read
	// every node's index, every read answered and nothing was found:
	// while both stand, nothing in the catalog moved since and we expect
	// nothing new of it, so a check has nothing to read
	// (consul.CatalogMarks). round is the round under way.
	marks     consul.CatalogMarks
	committed uint64
	round     marksRound
	nodes     map[string]consul.NodeEntry // ours, at the last check
	index     map[string]uint64           // per node: the last catalog index read
	kv        uint64                      // the highest KV index read (StateKey)
	turn      int                         // round-robin start of the next index reads
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

// finding is one reason to believe Consul lost data.
type finding struct{ signal, detail string }

// nodes checks a fresh node list against the last one; it returns the
// findings and records the list.
func (d *lossDetector) checkNodes(view consul.NodesView, written ...string) []finding {
	var out []finding
	now := map[string]consul.NodeEntry{}
	for _, n := range view.Nodes {
		if !n.Ours {
			continue
		}
		now[n.Name] = n
		if prev, ok := d.nodes[n.Name]; ok && prev.CreateIndex != n.CreateIndex {
			out = append(out, finding{SignalNodeRecreated, fmt.Sprintf("node %s was created again (create index %d, was %d)", n.Name, n.CreateIndex, prev.CreateIndex)})
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
		out = append(out, finding{SignalNodeVanished, fmt.Sprintf("node %s is gone", name)})
	}
	d.nodes = now
	return out
}

// due returns the nodes whose index the next check reads: all of them, or
// nodesPerCheck in turn.
func (d *lossDetector) due() []string {
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
func (d *lossDetector) checkIndex(node string, index, committed uint64) []finding {
	if d.index == nil {
		d.index = map[string]uint64{}
	}
	floor := max(d.index[node], committed)
	d.index[node] = index
	if index < floor {
		return []finding{{SignalIndexBack, fmt.Sprintf("the catalog index of node %s went back to %d from %d", node, index, floor)}}
	}
	return nil
}

// reset starts a new history after a loss: what was just read is the
// new normal. committed is the highest index our writes had committed;
// the highest index seen so far is kept as reused.
func (d *lossDetector) reset(committed uint64) {
	d.reused = max(d.reused, committed, d.kv, d.marks.Nodes, d.marks.Checks, d.round.marks.Nodes, d.round.marks.Checks)
	for _, i := range d.index {
		d.reused = max(d.reused, i)
	}
	d.index = nil
	d.kv = 0
	d.marks, d.committed, d.round = consul.CatalogMarks{}, 0, marksRound{}
}

// marksRound is a round of checks under the same marks and committed
// index: the nodes whose index it read.
type marksRound struct {
	marks     consul.CatalogMarks
	committed uint64
	read      map[string]bool
}

// settle records a check begun under marks and committed. A check with a
// read that got no answer starts the round over; once the round has read
// every node of ours, the marks are the ones a check may skip on.
func (d *lossDetector) settle(marks consul.CatalogMarks, committed uint64, complete bool, read []string) {
	if !complete || !marks.Known() {
		d.round = marksRound{}
		return
	}
	if d.round.read == nil || d.round.marks != marks || d.round.committed != committed {
		d.round = marksRound{marks: marks, committed: committed, read: map[string]bool{}}
	}
	for _, n := range read {
		d.round.read[n] = true
	}
	for n := range d.nodes {
		if !d.round.read[n] {
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
func (d *lossDetector) checkKV(index uint64) []finding {
	var out []finding
	if index < d.kv {
		out = append(out, finding{SignalIndexBack, fmt.Sprintf("Consul's KV index went back to %d from %d: its state was replaced (a snapshot restore?)", index, d.kv)})
	}
	d.kv = max(d.kv, index)
	return out
}

// WitnessReader is the part of the Store that keeps witnesses of its
// committed writes (consul.Client): each entry must be in Consul at its
// index or a later one, or, for our delete, gone (checkWitness). A
// restore taken before such a write undoes it, and catalog writes right
// after the restore cannot hide that, as they can hide the nodes' indexes
// going back.
type WitnessReader interface {
	Witnesses() []consul.Witness // oldest first
	IsWitness(consul.Witness) bool
	// ForgetWitnesses retires those of a Service this process hands to
	// another replica (which may rewrite or delete its entries).
	ForgetWitnesses(idPrefix string)
	ReadWitness(ctx context.Context, w consul.Witness) (consul.WitnessRead, error)
}

// witnessAges picks the witnesses a check reads: the newest, and the
// newest at least this old for each age, so that a restore of a snapshot
// of any age up to maxWitnessAge undoes one of them, even when writes
// after the restore made newer witnesses.
var witnessAges = []time.Duration{2 * time.Second, 5 * time.Second, 15 * time.Second, time.Minute, maxWitnessAge}

// maxWitnessAge: older witnesses are not read (an idle fleet reads none).
const maxWitnessAge = 5 * time.Minute

// witnessSince reports whether a write or delete of ours committed since
// the last complete check began. Such a write moved the marks, and a
// restore of a snapshot taken before it brings them back exactly: a
// delete or a change of readiness alone moves no committed index, so the
// skip on equal marks must not take the catalog for unchanged (the
// review's finding: a Service's deletes undone that way stayed for good).
func witnessSince(ws []consul.Witness, since time.Time) bool {
	return len(ws) > 0 && !ws[len(ws)-1].At.Before(since)
}

// maxSinceReads bounds the witnesses from since that one check reads (a
// check reads those of about one check interval: two a second).
const maxSinceReads = 64

// checkWitnesses reads the picked witnesses; one not as we left it (gone,
// at another index, or back after our delete: twice, and still standing:
// a write or delete of ours sent while it was read is no loss) is a
// finding.
// It also reports whether every read answered.
//
// Picked: every witness from since (when the last complete check began)
// and the newest one from before it. A restore after since undoes our
// writes from the snapshot's time to the restore's, a run of them with
// nothing of ours after it but writes made after the restore: either one
// of them is from since on, or the newest from before since is the last
// of them, so writes after the restore, however many, hide neither. (The
// age picks alone missed a run that fell between two of them: found by
// TestRestoreAfterAServiceWentRepairs, a Service's deletes undone and a
// write 70 ms after the restore. A run shorter than the witnesses'
// thinning, 500 ms, can still go unseen: a write within it replaced the
// run's witness.) A restore before since was the last check's to find.
// Past maxSinceReads from since, the oldest are read, and the time of the
// first left unread is returned (zero: none), for the next check to go on
// from. Also picked: the newest, and the newest at least each of
// witnessAges old.
func checkWitnesses(ctx context.Context, wr WitnessReader, ws []consul.Witness, now, since time.Time, reused uint64) ([]finding, bool, time.Time) {
	var picked []consul.Witness
	pick := func(w consul.Witness) {
		if now.Sub(w.At) <= maxWitnessAge && !slices.Contains(picked, w) {
			picked = append(picked, w)
		}
	}
	if len(ws) > 0 {
		pick(ws[len(ws)-1])
	}
	first := sort.Search(len(ws), func(i int) bool { return !ws[i].At.Before(since) })
	if first > 0 {
		pick(ws[first-1])
	}
	// The oldest first: past maxSinceReads, the next check goes on from
	// the first left unread.
	next := time.Time{}
	if first+maxSinceReads < len(ws) {
		next = ws[first+maxSinceReads].At
	}
	for _, w := range ws[first:min(len(ws), first+maxSinceReads)] {
		pick(w)
	}
	for _, age := range witnessAges {
		for i := len(ws) - 1; i >= 0; i-- {
			if now.Sub(ws[i].At) >= age {
				pick(ws[i])
				break
			}
		}
	}
	for _, w := range picked {
		f, ok := checkWitness(ctx, wr, w, reused)
		if f != nil || !ok {
			return f, ok, next
		}
	}
	return nil, true, next
}

// checkWitness reads one witness: a finding, or none and whether the
// reads answered. Our entry must not be older than written (gone, or at a
// lower index), nor back from before our delete (at an index below the
// one the delete committed after). A later index is someone's later
// write: another process of this cluster (a rolling update, a change of
// --shards) writes our entries too. Someone else's entry under the ID is
// no loss either (the worker leaves it alone).
//
// Except at indexes up to reused: Consul that lost its last writes hands
// their indexes out again, and a restore of a snapshot taken before that
// loss brings entries back at indexes above the ones written since (found
// by the soak: a kill -9 of every Consul server, then such a restore). A
// witness at such an index stands only while its entry is at exactly that
// index, or, for a delete, gone.
func checkWitness(ctx context.Context, wr WitnessReader, w consul.Witness, reused uint64) ([]finding, bool) {
	strict := w.Index <= reused
	// At the index written, or (where Consul handed out no index twice:
	// each index on its own, a check rewritten since a loss is above
	// reused even when its service is not) a later one.
	stands := func(read, written uint64) bool { return read == written || (written > reused && read > written) }
	var r consul.WitnessRead
	for range 2 {
		var err error
		if r, err = wr.ReadWitness(ctx, w); err != nil {
			return nil, false
		}
		var asLeft bool
		switch {
		case w.Deleted:
			asLeft = !r.Found || !r.Ours || (!strict && r.Index >= w.Index)
		default:
			asLeft = r.Found && (!r.Ours || (stands(r.Index, w.Index) && (w.CheckIndex == 0 || stands(r.CheckIndex, w.CheckIndex))))
		}
		if asLeft || !wr.IsWitness(w) {
			return nil, true
		}
	}
	switch {
	case w.Deleted:
		return []finding{{SignalEntryLost, fmt.Sprintf("entry %s on node %s, deleted by us after index %d, is back at index %d", w.ID, w.Node, w.Index, r.Index)}}, true
	case !r.Found:
		return []finding{{SignalEntryLost, fmt.Sprintf("entry %s on node %s, committed at index %d, is gone", w.ID, w.Node, w.Index)}}, true
	}
	return []finding{{SignalEntryLost, fmt.Sprintf("entry %s on node %s, committed at index %d (check %d), is at index %d (check %d)", w.ID, w.Node, w.Index, w.CheckIndex, r.Index, r.CheckIndex)}}, true
}

// watchConsul runs until ctx is done. Every NodeCheckInterval it reads the
// nodes named like ours: a look-alike node (someone else's, with our name)
// is reported and makes the fleet unready; a sign that Consul lost or
// rolled back data (see lossDetector), or a worker's evidence of it, makes
// every worker re-read and repair its Service now instead of within its
// anti-entropy period.
func (s *Supervisor) watchConsul(ctx context.Context) {
	nw, wr := s.opts.Store, s.opts.Store
	if s.opts.NodeCheckInterval <= 0 {
		<-ctx.Done()
		return
	}
	var d lossDetector
	reported := map[string]bool{} // foreign nodes logged
	first := true
	failed := false             // the last read got no answer
	var frozen []consul.Witness // the witnesses when reads started failing
	for {
		var evidence string
		if !first {
			t := s.opts.Clock.NewTimer(s.opts.NodeCheckInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case evidence = <-s.lossC:
				t.Stop()
			case <-t.C():
			}
		}
		first = false
		began := s.opts.Clock.Now()
		if evidence != "" {
			s.dataLost(ctx, nw, &d, []finding{{SignalWorker, evidence}})
			continue
		}
		// The catalog's marks where a round of checks that read every
		// node and found nothing left them, and no write of ours
		// committed since: nothing in the catalog moved since that round
		// and we expect nothing new of it, so there is nothing to read.
		// (A write of ours counts: a restore of a snapshot taken before
		// it brings back exactly the marks seen before it.) The marks
		// come from a read begun after committed was taken (a shared
		// read from before a write of ours would stand for a catalog
		// without it), and the workers' passes share it: two requests a
		// second for the whole fleet instead of the node list and
		// nodesPerCheck node indexes.
		committed := committedMax(nw)
		// The witnesses this check reads: one committed while it runs is
		// after began, the next check's.
		ws := wr.Witnesses()
		marks, merr := s.opts.Store.CatalogMarks(ctx, time.Now())
		if merr == nil && !failed && frozen == nil && marks.Known() && marks == d.marks && committed == d.committed &&
			!witnessSince(ws, d.since) {
			continue
		}
		// The nodes our writes committed to, taken before the read: the
		// read cannot miss one of them unless Consul lost it (even one
		// created and lost between two checks).
		written := nw.CommittedNodes()
		view, err := nw.ReadNodes(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Debug("Cannot read the cluster's Consul nodes", "error", err)
			}
			if !failed {
				// The writes just before the outage are those a crash
				// loses first: check them once Consul answers, even if
				// writes after it made newer witnesses.
				frozen = wr.Witnesses()
			}
			failed = ctx.Err() == nil
			continue // unreachable: the health probe reports it
		}
		s.foreignNodes(view.Foreign(), reported)
		found, read, complete := checkConsul(ctx, nw, &d, view, written)
		if s.opts.StateKey != "" && len(found) == 0 {
			if ix, err := s.opts.Store.KVIndex(ctx, s.opts.StateKey); err == nil {
				found = d.checkKV(ix)
			} else {
				complete = false
			}
		}
		if len(found) == 0 {
			now := s.opts.Clock.Now()
			var ok, frozenOK bool
			var next time.Time
			found, ok, next = checkWitnesses(ctx, wr, ws, now, d.since, d.reused)
			if len(found) == 0 && frozen != nil {
				found, frozenOK, _ = checkWitnesses(ctx, wr, frozen, now, d.since, d.reused)
				ok = ok && frozenOK
			}
			switch {
			case !ok:
			case next.IsZero():
				d.since = began // the next check reads what is newer
			default:
				d.since = next // more than one check reads: it goes on there
			}
			complete = complete && ok
		}
		frozen = nil
		if len(found) > 0 {
			s.dataLost(ctx, nw, &d, found)
		} else {
			d.settle(marks, committed, complete && merr == nil, read)
		}
		if failed {
			// Consul answers again (checked for losses first, so that no
			// retry writes before the check): a worker whose flush
			// failed while it was away retries now, not at the end of
			// its backoff.
			failed = false
			n := s.retryAll()
			s.log.Info("Consul answers again; workers backing off retry now", "workers", n)
		}
	}
}

// checkConsul is one check of a node read: the nodes, then the indexes of
// the nodes due. It also returns the nodes whose index it read, and
// whether every read answered.
func checkConsul(ctx context.Context, nw NodeWatcher, d *lossDetector, view consul.NodesView, written []string) (found []finding, read []string, complete bool) {
	found = d.checkNodes(view, written...)
	for _, node := range d.due() {
		// The committed floor first: a write committing between the two
		// reads then only raises the index, never the floor.
		committed := nw.Committed(node)
		idx, err := nw.NodeIndex(ctx, node)
		if err != nil {
			return found, read, false
		}
		read = append(read, node)
		found = append(found, d.checkIndex(node, idx, committed)...)
	}
	return found, read, true
}

// lossSeen is a worker's report that Consul lost entries it wrote.
func (s *Supervisor) lossSeen(reason string) {
	select {
	case s.lossC <- reason:
	default: // one is pending: it covers this one
	}
}

func (s *Supervisor) dataLost(ctx context.Context, nw NodeWatcher, d *lossDetector, found []finding) {
	d.reset(committedMax(nw))
	nw.ResetCommitted()
	n := s.repairAll(ctx)
	details := make([]string, 0, len(found))
	for _, f := range found {
		s.opts.Hooks.Consul.ConsulDataLost(f.signal)
		details = append(details, f.detail)
	}
	s.log.Warn("Consul lost or rolled back data; every worker re-reads its Service and repairs it now", "workers", n, "evidence", strings.Join(details, "; "))
}

// repairAll makes every worker repair its Service from one read of every
// node of the cluster (worker.Adopt), and starts a worker for each Service
// that has entries there and none running (its Service deleted or
// deselected since: a restore brought its entries back); it returns the
// number of workers told. When the read fails, each worker re-reads its
// own instead (worker.Resync).
func (s *Supervisor) repairAll(ctx context.Context) int {
	start := s.opts.Clock.Now()
	entries, err := s.opts.Store.ReadNode(ctx)
	if err != nil {
		s.log.Warn("Cannot read the cluster's nodes after a loss; every worker reads its own", "error", err)
		return s.resyncAll()
	}
	owned, _ := worker.HoldOwned(s.opts.Worker.Cluster, entries)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for key, e := range s.workers {
		e.w.Adopt(owned[key], start)
		n++
	}
	for key := range owned {
		if _, ok := s.workers[key]; !ok && s.ctx.Err() == nil && s.holds(key) {
			// It reads its entries itself: the read above may predate a
			// worker of the same Service that finished meanwhile.
			if w := s.startLocked(key, nil, false); w != nil {
				n++
			}
		}
	}
	return n
}

// foreignNodes reports look-alike nodes: logged once each, counted, and
// kept as a readiness problem while they exist.
func (s *Supervisor) foreignNodes(nodes []consul.NodeEntry, reported map[string]bool) {
	s.opts.Hooks.Consul.ForeignNodes(len(nodes))
	now := map[string]bool{}
	s.problemsMu.Lock()
	for k := range s.problems {
		if strings.HasPrefix(k, "node/") {
			delete(s.problems, k)
		}
	}
	for _, n := range nodes {
		now[n.Name] = true
		err := &consul.ForeignNodeError{Node: n.Name, Address: n.Address, Meta: n.Meta}
		if s.nodeInUse(n.Name) {
			s.problems["node/"+n.Name] = err.Error()
		}
		if !reported[n.Name] {
			s.log.Error("A node named like ours is someone else's; nothing is written onto it", "node", n.Name, "address", n.Address, "meta", n.Meta)
		}
	}
	s.problemsMu.Unlock()
	for name := range reported {
		if !now[name] {
			delete(reported, name)
			s.log.Info("The look-alike node is gone; its Services sync again", "node", name)
		}
	}
	for name := range now {
		reported[name] = true
	}
}

// nodeInUse reports whether instances are placed on node with the current
// number of Consul nodes (a look-alike beyond them blocks nothing).
func (s *Supervisor) nodeInUse(node string) bool {
	n, ok := s.opts.Worker.Cluster.NodeNumber(node)
	return ok && n < s.consulNodes()
}

// Problems returns what keeps the fleet from syncing every Service (a
// look-alike node, say), sorted; /readyz fails while there is any.
func (s *Supervisor) Problems() []string {
	s.problemsMu.Lock()
	defer s.problemsMu.Unlock()
	out := make([]string, 0, len(s.problems))
	for _, p := range s.problems {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
