package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetsync/fleetsync/consul"
)

// flush runs one sync and updates the schedule. It reports whether the
// worker is finished.
func (w *Worker) flush(ctx context.Context, s *scheduler) (finished bool) {
	// A wake-up queued before this point is covered by this flush, which
	// reads the state after it: drop it, or it would cause a second look
	// (and a "pending" status) for nothing.
	select {
	case <-w.trigger:
	default:
	}
	defer func() {
		if w.early != nil { // the flush wrote nothing: the budget waited for goes back
			w.early.Release()
			w.early = nil
		}
	}()
	since := w.pendingSince.Swap(0)
	events := w.events.Load()
	coalesced := events - w.eventsFlushed
	w.eventsFlushed = events
	s.Dirty = false
	w.mu.Lock()
	before := w.status.State
	w.mu.Unlock()
	w.setState(StateFlushing)
	res, err := w.sync(ctx, s, coalesced > 0)
	w.lookedEmpty = err == nil && res.applied.Txns == 0 && !res.skipped
	if res.skipped && before != StateFlushing {
		res.before = before
	}
	if err == nil && !res.invalid {
		w.blockedNow = res.blocked
	}
	now := w.clock.Now()
	if err != nil || res.applied.Txns > 0 {
		// Only a write (or a failed attempt) opens a window: a look that
		// found nothing to do leaves the next change free to go at once.
		s.Flushed(now, err)
	} else {
		s.Failures = 0
	}
	if res.window != nil {
		s.Window = *res.window
	}
	if errors.Is(err, consul.ErrFenced) {
		w.fenced = true // Run ends: the write is stale, never retried
	}
	if err != nil {
		s.Dirty = true
		if since != 0 {
			w.pendingSince.CompareAndSwap(0, since)
		}
		if unreachable(err) && ctx.Err() == nil {
			// Consul may come back without its data (a restarted dev
			// agent, a restored snapshot): the retry re-reads what is
			// there before it diffs, or instances the cache believes
			// registered would stay missing until the next periodic pass.
			w.forceResync()
		}
	}
	w.armResync()
	w.record(ctx, now, since, coalesced, res, err, s)
	return err == nil && res.finished
}

// armResync starts the anti-entropy timer at the end of the worker's first
// flush (firstResync): what the worker holds was read or written then. In
// a cold start a worker's first flush ends with its write, which may
// wait its turn for a minute or more behind the rest of the fleet's.
func (w *Worker) armResync() {
	if w.resyncTimer == nil && w.opts.ResyncPeriod > 0 {
		w.resyncTimer = w.clock.NewTimer(firstResync(w.opts.ResyncPeriod))
	}
}

// syncResult is what one sync did.
type syncResult struct {
	resync   bool // an anti-entropy pass (its writes are drift repairs)
	window   *time.Duration
	desired  int
	applied  consul.Applied
	finished bool
	invalid  bool
	skipped  bool   // a periodic pass that found nothing changed: the last look's status stands
	before   State  // with skipped: the state before the pass
	problem  string // why the Service is invalid
	blocked  int    // desired instances left out: someone else's entry holds their ID
}

// sync computes the desired state, diffs it against the owned state and
// writes the difference, in steps: an anti-entropy pass's read (when one
// is due), the owned state, the look (desired state and diff, look.go),
// the write budget (budget.go), the write. A CAS conflict re-reads the
// owned state and tries once more before it is returned as an error. A
// panic is returned as a *PanicError.
//
// notified says a change came since the last flush: a periodic pass that
// finds nothing changed in Consul (unchangedSince) then still diffs;
// without one it is done.
func (w *Worker) sync(ctx context.Context, s *scheduler, notified bool) (res syncResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = asPanicError(p)
		}
	}()
	res.resync = w.resyncDue
	if res.resync {
		if res.skipped, err = w.beginResync(ctx, s, notified); err != nil || res.skipped {
			return res, err
		}
	}
	for attempt := 0; ; attempt++ {
		if !w.ownedKnown {
			if err := w.readOwned(ctx); err != nil {
				return res, err
			}
		}
		var ch consul.Change
		resync := res.resync
		ch, res, err = w.change(ctx, s)
		res.resync = resync
		if err != nil || res.invalid {
			return res, err
		}
		if ch.Empty() {
			res.finished = w.done()
			return res, nil
		}
		applied, err := w.write(ctx, ch, attempt, resync)
		res.applied = counts(applied)
		if err == nil {
			res.finished = w.done()
			return res, nil
		}
		if !errors.Is(err, consul.ErrConflict) {
			return res, err
		}
		if rerr := w.conflicted(ctx); rerr != nil {
			return res, rerr
		}
		if attempt > 0 || ctx.Err() != nil {
			return res, err
		}
	}
}

// beginResync starts an anti-entropy pass: when only the period asked for
// it and nothing moved in Consul since the last look (unchangedSince), it
// reports skip if the last look's status stands (no change notified, no
// failure, nothing blocked); otherwise it reads the owned state by name,
// or marks it unknown when it cannot (readOwned then reads it by ID). On
// error the pass stays due.
func (w *Worker) beginResync(ctx context.Context, s *scheduler, notified bool) (skip bool, err error) {
	unchanged := false
	if w.resyncTimed {
		if unchanged, err = w.unchangedSince(ctx); err != nil {
			return false, err
		}
	}
	w.resyncDue, w.resyncTimed = false, false
	switch {
	case unchanged && !notified && s.Failures == 0 && w.blockedNow == 0:
		return true, nil // Consul holds what the last look left: nothing to do
	case unchanged:
	default:
		if used, err := w.readOwnedByName(ctx); err != nil {
			w.resyncDue = true
			return false, err
		} else if !used {
			w.ownedKnown = false
		}
	}
	return false, nil
}

// change looks (the desired state and its diff) and waits for the write
// budget of what it found; what it returns holds the permit, or is empty.
// The result is the latest look's.
func (w *Worker) change(ctx context.Context, s *scheduler) (consul.Change, syncResult, error) {
	gen := w.events.Load() // before the Lookup: a later change is seen by acquire
	ch, res := w.look()
	if res.invalid || ch.Empty() {
		return ch, res, nil
	}
	high := s.isolated || (len(ch.Register) == 0 && len(ch.Update) == 0)
	ch, again, err := w.acquire(ctx, high, ch, gen)
	if again != nil {
		// Looked again while it waited: what the flush reports
		// (blocked instances above all, which keep the recheck
		// running) is that look's, not the stale one's.
		res = *again
	}
	return ch, res, err
}

// write applies ch and keeps what was written as the owned state.
func (w *Worker) write(ctx context.Context, ch consul.Change, attempt int, resync bool) (applied consul.Applied, err error) {
	if w.log.IsTrace() {
		w.log.Trace("Writing", "register", idsOf(ch.Register, instanceID), "update", idsOf(ch.Update, updateID),
			"deregister", idsOf(ch.Deregister, registeredID), "resync", resync, "attempt", attempt)
	}
	ch.Fence = w.opts.Fence
	aside(func() { applied, err = w.opts.Store.Apply(ctx, ch) })
	w.lastWrite = w.clock.Now()
	if w.log.IsTrace() {
		w.log.Trace("Wrote", "written", idsOf(applied.Written, registeredID), "deleted", applied.Deleted, "error", err)
	}
	w.verified = nil // our write moved the indexes: the next pass reads
	w.merge(applied)
	return applied, err
}

// conflicted re-reads the owned state after a CAS conflict; entries this
// worker wrote that are now gone or older than written tell the fleet
// (OnLoss) that Consul lost or rolled back data.
func (w *Worker) conflicted(ctx context.Context) error {
	w.opts.Observer.Conflict()
	w.mu.Lock()
	w.status.Conflicts++
	w.mu.Unlock()
	held := w.owned
	w.ownedKnown = false
	if err := w.readOwned(ctx); err != nil {
		return err
	}
	if why := lossEvidence(held, w.owned, w.foreign); why != "" && w.opts.OnLoss != nil {
		w.log.Warn("Consul lost or rolled back entries this worker wrote; asking the fleet to look", "evidence", why)
		w.opts.OnLoss(fmt.Sprintf("service %s: %s", w.opts.Key, why))
	}
	return nil
}

// counts keeps the counts of a, not what it wrote (the owned state has it).
func counts(a consul.Applied) consul.Applied {
	return consul.Applied{Txns: a.Txns, Ops: a.Ops, Registered: a.Registered, Updated: a.Updated, Deregistered: a.Deregistered}
}

// done reports whether the worker has nothing left to do: its Service is
// not synced and it owns nothing in Consul.
func (w *Worker) done() bool { return len(w.owned) == 0 && !w.selected() }

// idsOf names the instances of a change, for trace logs.
func idsOf[T any](in []T, id func(*T) string) []string {
	out := make([]string, len(in))
	for i := range in {
		out[i] = id(&in[i])
	}
	return out
}

func instanceID(in *consul.Instance) string    { return in.ID }
func updateID(u *consul.Update) string         { return u.Want.ID }
func registeredID(r *consul.Registered) string { return r.ID }
