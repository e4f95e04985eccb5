package loss

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul"
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

// Store is what a Watch reads of Consul (consul.Client).
type Store interface {
	NodeWatcher
	WitnessReader
	// CatalogMarks are the catalog's marks from a read begun at or after
	// after (consul.CatalogMarks).
	CatalogMarks(ctx context.Context, after time.Time) (consul.CatalogMarks, error)
	// KVIndex reads Consul's KV index at key (see Config.StateKey).
	KVIndex(ctx context.Context, key string) (uint64, error)
}

// Config builds a Watch. Store and Lost are required.
type Config struct {
	Store Store
	Clock clock.Clock  // default: the real clock
	Log   hclog.Logger // default: discard
	// Interval is the time between two checks (0: none; Run waits for
	// its context).
	Interval time.Duration
	// StateKey is a Consul KV key nobody writes: Consul answers a missing
	// key with the KV table's index, which moves only on KV writes, so a
	// snapshot restore shows as that index going back even when catalog
	// writes right after it raised the nodes' indexes. "": not read.
	StateKey string
	// Lost is told of a loss, once per check that finds one, with what
	// the check found, after the Watch started a new history (what it just
	// read is the new normal). It runs on the Watch's goroutine: the next
	// check waits for it.
	Lost func(ctx context.Context, found []Finding)
	// Foreign, when set, is told the look-alike nodes (named like ours,
	// someone else's) of every node list read.
	Foreign func(nodes []consul.NodeEntry)
	// Guard, when set, runs each check Run makes; an error it returns
	// (a panic in a read it recovered) counts as a check without an
	// answer, as a failed node read does.
	Guard func(check func() error) error
	// Answering, when set, is told when Consul answers a check again
	// after a check got no answer, once the check found no loss or
	// reported it.
	Answering func()
	// Confirm, when set, runs when a check finds a witness not as we left
	// it, before that is judged a loss: it makes the Store forget the
	// witnesses of every Service this process no longer syncs but was not
	// yet told so (a replica stopped past its shard Lease, whose shards
	// another replica took and rewrote meanwhile) and returns once they
	// are forgotten; the check then reads the witnesses again. An error:
	// not known, the check ends without a judgement (the next one reads
	// the same witnesses).
	Confirm func(ctx context.Context) error
}

// Watch is the loop of checks. Report may be called from any goroutine;
// Run and Step from one.
type Watch struct {
	cfg      Config
	evidence pending // the workers' evidence, not yet judged
	d        detector
	failed   bool             // the last node read got no answer
	frozen   []consul.Witness // the witnesses when reads started failing
}

// New returns a Watch; it checks nothing until Run or Step.
func New(cfg Config) *Watch {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	return &Watch{cfg: cfg, evidence: pending{wake: make(chan struct{}, 1)}}
}

// Run checks at once, then every Interval and at each Report, until ctx
// is done.
func (w *Watch) Run(ctx context.Context) {
	if w.cfg.Interval <= 0 {
		<-ctx.Done()
		return
	}
	w.check(ctx)
	for {
		t := w.cfg.Clock.NewTimer(w.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-w.evidence.wake:
			t.Stop()
			w.check(ctx)
		case <-t.C():
			w.check(ctx)
		}
	}
}

// check is one Step, with the workers' evidence that still stands
// (judgeEvidence), under Config.Guard.
func (w *Watch) check(ctx context.Context) {
	step := func() error { w.Step(ctx, w.judgeEvidence(ctx)); return nil }
	if w.cfg.Guard == nil {
		_ = step()
		return
	}
	if err := w.cfg.Guard(step); err != nil {
		w.cfg.Log.Debug("The check of the cluster's Consul nodes failed", "error", err)
		w.unanswered(ctx)
	}
}

// unanswered records a check that got no answer.
func (w *Watch) unanswered(ctx context.Context) {
	if !w.failed {
		// The writes just before the outage are those a crash loses
		// first: check them once Consul answers, even if writes after
		// it made newer witnesses.
		w.frozen = w.cfg.Store.Witnesses()
	}
	w.failed = ctx.Err() == nil
}

// Step is one check, begun at the clock's now. With evidence (a worker's
// report) it is a loss without reading anything. Otherwise, unless the
// catalog's marks show that nothing moved since the last complete check,
// it reads the nodes named like ours, the indexes of those due, the KV
// index and the witnesses due; a loss found goes to Config.Lost.
func (w *Watch) Step(ctx context.Context, evidence string) {
	began := w.cfg.Clock.Now()
	if evidence != "" {
		w.lost(ctx, []Finding{{SignalWorker, evidence}})
		return
	}
	st := w.cfg.Store
	// The catalog's marks where a sweep of checks that read every node
	// and found nothing left them, and no write of ours committed since:
	// nothing in the catalog moved since that sweep and we expect nothing
	// new of it, so there is nothing to read. (A write of ours counts: a
	// restore of a snapshot taken before it brings back exactly the marks
	// seen before it.) The marks come from a read begun after committed
	// was taken (a shared read from before a write of ours would stand
	// for a catalog without it), and the workers' passes share it: two
	// requests a second for the whole fleet instead of the node list and
	// nodesPerCheck node indexes.
	committed := committedMax(st)
	// The witnesses this check reads: one committed while it runs is
	// after began, the next check's.
	ws := st.Witnesses()
	marks, merr := st.CatalogMarks(ctx, began)
	if merr == nil && !w.failed && w.frozen == nil && marks.Known() && marks == w.d.marks && committed == w.d.committed &&
		!witnessSince(ws, w.d.since) {
		return
	}
	// The nodes our writes committed to, taken before the read: the read
	// cannot miss one of them unless Consul lost it (even one created and
	// lost between two checks).
	written := st.CommittedNodes()
	view, err := st.ReadNodes(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.cfg.Log.Debug("Cannot read the cluster's Consul nodes", "error", err)
		}
		w.unanswered(ctx)
		return // unreachable: the health probe reports it
	}
	if w.cfg.Foreign != nil {
		w.cfg.Foreign(view.Foreign())
	}
	found, read, complete := checkConsul(ctx, st, &w.d, view, written)
	if w.cfg.StateKey != "" && len(found) == 0 {
		if ix, err := st.KVIndex(ctx, w.cfg.StateKey); err == nil {
			found = w.d.checkKV(ix)
		} else {
			complete = false
		}
	}
	if len(found) == 0 {
		var ok bool
		found, ok = w.checkWitnesses(ctx, ws, began)
		complete = complete && ok
	}
	w.frozen = nil
	if len(found) > 0 {
		w.lost(ctx, found)
	} else {
		w.d.settle(marks, committed, complete && merr == nil, read)
	}
	if w.failed {
		// Consul answers again (checked for losses first, so that no
		// retry writes before the check).
		w.failed = false
		if w.cfg.Answering != nil {
			w.cfg.Answering()
		}
	}
}

// checkWitnesses reads the witnesses due, and those standing when reads
// started failing; it reports whether every read answered, and moves the
// detector's since on. A witness not as we left it is judged only once
// Config.Confirm made sure the Store witnesses only the Services this
// process still syncs.
func (w *Watch) checkWitnesses(ctx context.Context, ws []consul.Witness, began time.Time) ([]Finding, bool) {
	now := w.cfg.Clock.Now()
	found, ok, next := w.readWitnesses(ctx, ws, now)
	if len(found) > 0 && w.cfg.Confirm != nil {
		if err := w.cfg.Confirm(ctx); err != nil {
			if ctx.Err() == nil {
				w.cfg.Log.Warn("Cannot confirm which Services this replica still syncs; the witnesses are judged at the next check", "error", err, "evidence", found[0].Detail)
			}
			return nil, false
		}
		// Those of Services handed over meanwhile are forgotten now.
		found, ok, next = w.readWitnesses(ctx, w.cfg.Store.Witnesses(), now)
	}
	switch {
	case !ok:
	case next.IsZero():
		w.d.since = began // the next check reads what is newer
	default:
		w.d.since = next // more than one check reads: it goes on there
	}
	return found, ok
}

// readWitnesses is one reading of the witnesses picked from ws, and of
// those standing when reads started failing (see checkWitnesses).
func (w *Watch) readWitnesses(ctx context.Context, ws []consul.Witness, now time.Time) ([]Finding, bool, time.Time) {
	found, ok, next := checkWitnesses(ctx, w.cfg.Store, ws, now, w.d.since, w.d.reused)
	if len(found) == 0 && w.frozen != nil {
		var frozenOK bool
		found, frozenOK, _ = checkWitnesses(ctx, w.cfg.Store, w.frozen, now, w.d.since, w.d.reused)
		ok = ok && frozenOK
	}
	return found, ok, next
}

// lost starts a new history and tells the owner.
func (w *Watch) lost(ctx context.Context, found []Finding) {
	w.d.reset(committedMax(w.cfg.Store))
	w.cfg.Store.ResetCommitted()
	w.cfg.Lost(ctx, found)
}

// checkConsul is one check of a node read: the nodes, then the indexes of
// the nodes due. It also returns the nodes whose index it read, and
// whether every read answered.
func checkConsul(ctx context.Context, nw NodeWatcher, d *detector, view consul.NodesView, written []string) (found []Finding, read []string, complete bool) {
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
