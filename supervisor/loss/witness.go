package loss

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/fleetsync/fleetsync/consul"
)

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
// of any age up to MaxWitnessAge undoes one of them, even when writes
// after the restore made newer witnesses.
var witnessAges = []time.Duration{2 * time.Second, 5 * time.Second, 15 * time.Second, time.Minute, MaxWitnessAge}

// MaxWitnessAge: older witnesses are not read (an idle fleet reads none).
const MaxWitnessAge = 5 * time.Minute

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
func checkWitnesses(ctx context.Context, wr WitnessReader, ws []consul.Witness, now, since time.Time, reused uint64) ([]Finding, bool, time.Time) {
	var picked []consul.Witness
	pick := func(w consul.Witness) {
		if now.Sub(w.At) <= MaxWitnessAge && !slices.Contains(picked, w) {
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
func checkWitness(ctx context.Context, wr WitnessReader, w consul.Witness, reused uint64) ([]Finding, bool) {
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
		return []Finding{{SignalEntryLost, fmt.Sprintf("entry %s on node %s, deleted by us after index %d, is back at index %d", w.ID, w.Node, w.Index, r.Index)}}, true
	case !r.Found:
		return []Finding{{SignalEntryLost, fmt.Sprintf("entry %s on node %s, committed at index %d, is gone", w.ID, w.Node, w.Index)}}, true
	}
	return []Finding{{SignalEntryLost, fmt.Sprintf("entry %s on node %s, committed at index %d (check %d), is at index %d (check %d)", w.ID, w.Node, w.Index, w.CheckIndex, r.Index, r.CheckIndex)}}, true
}
