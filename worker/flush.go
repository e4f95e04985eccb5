package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
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
// writes the difference. A CAS conflict re-reads the owned state and tries
// once more before it is returned as an error.
//
// notified says a change came since the last flush: a periodic pass that
// finds nothing changed in Consul (unchangedSince) then still diffs;
// without one it is done.
func (w *Worker) sync(ctx context.Context, s *scheduler, notified bool) (res syncResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			buf := make([]byte, 8<<10)
			buf = buf[:runtime.Stack(buf, false)]
			err = &PanicError{Value: p, Stack: string(buf)}
		}
	}()
	resyncPass := w.resyncDue
	if w.resyncDue {
		res.resync = true
		unchanged := false
		if w.resyncTimed {
			if unchanged, err = w.unchangedSince(ctx); err != nil {
				return res, err // still due
			}
		}
		w.resyncDue, w.resyncTimed = false, false
		switch {
		case unchanged && !notified && s.Failures == 0 && w.blockedNow == 0:
			res.skipped = true
			return res, nil // Consul holds what the last look left: nothing to do
		case unchanged:
		default:
			if used, err := w.readOwnedByName(ctx); err != nil {
				w.resyncDue = true
				return res, err
			} else if !used {
				w.ownedKnown = false
			}
		}
	}
	for attempt := 0; ; attempt++ {
		if !w.ownedKnown {
			if err := w.readOwned(ctx); err != nil {
				return res, err
			}
		}
		gen := w.events.Load() // before the Lookup: a later change is seen by acquire
		ch, r, err := w.look()
		res = r
		res.resync = resyncPass
		if err != nil || res.invalid {
			return res, nil
		}
		if ch.Empty() {
			res.finished = len(w.owned) == 0 && !w.selected()
			return res, nil
		}
		high := s.isolated || (len(ch.Register) == 0 && len(ch.Update) == 0)
		var again *syncResult
		ch, again, err = w.acquire(ctx, high, ch, gen)
		if again != nil {
			// Looked again while it waited: what the flush reports
			// (blocked instances above all, which keep the recheck
			// running) is that look's, not the stale one's.
			res = *again
			res.resync = resyncPass
		}
		if err != nil || res.invalid {
			return res, err
		}
		if ch.Empty() {
			res.finished = len(w.owned) == 0 && !w.selected()
			return res, nil
		}
		if w.log.IsTrace() {
			w.log.Trace("Writing", "register", idsOf(ch.Register, instanceID), "update", idsOf(ch.Update, updateID),
				"deregister", idsOf(ch.Deregister, registeredID), "resync", resyncPass, "attempt", attempt)
		}
		var applied consul.Applied
		deep(func() { applied, err = w.opts.Store.Apply(ctx, ch) })
		w.lastWrite = w.clock.Now()
		if w.log.IsTrace() {
			w.log.Trace("Wrote", "written", idsOf(applied.Written, registeredID), "deleted", applied.Deleted, "error", err)
		}
		w.verified = nil // our write moved the indexes: the next pass reads
		w.merge(applied)
		res.applied.Txns += applied.Txns
		res.applied.Ops += applied.Ops
		res.applied.Registered += applied.Registered
		res.applied.Updated += applied.Updated
		res.applied.Deregistered += applied.Deregistered
		if err == nil {
			res.finished = len(w.owned) == 0 && !w.selected()
			return res, nil
		}
		if errors.Is(err, consul.ErrConflict) {
			w.opts.Observer.Conflict()
			w.mu.Lock()
			w.status.Conflicts++
			w.mu.Unlock()
			held := w.owned
			w.ownedKnown = false
			if rerr := w.readOwned(ctx); rerr != nil {
				return res, rerr
			}
			if why := lossEvidence(held, w.owned, w.foreign); why != "" && w.opts.OnLoss != nil {
				w.log.Warn("Consul lost or rolled back entries this worker wrote; asking the fleet to look", "evidence", why)
				w.opts.OnLoss(fmt.Sprintf("service %s: %s", w.opts.Key, why))
			}
			if attempt == 0 && ctx.Err() == nil {
				continue
			}
		}
		return res, err
	}
}

// acquire waits for the write budget for ch, the diff of the state seen at
// notification count gen. If a notification came while the worker waited,
// it diffs again: the latest state is what gets written (or nothing, if it
// now agrees). Otherwise ch still holds: the owned state changes only in
// this goroutine, and every change of a worker's inputs (its Service, its
// slices, the nodes, a name reservation) notifies it; a cold start of
// 10,000 Services, all waiting for the budget, computed every desired
// state twice before (21 % of its CPU). High priority goes to isolated
// changes and to changes that only remove instances.
func (w *Worker) acquire(ctx context.Context, high bool, ch consul.Change, gen uint64) (consul.Change, *syncResult, error) {
	if w.early != nil { // waited for before the look, which saw the latest state
		permit := *w.early
		w.early = nil
		if err := ctx.Err(); err != nil || ch.Empty() {
			permit.Release()
			return consul.Change{}, nil, err
		}
		ch.High, ch.Permit = high, permit
		ch.NodeFor = w.opts.Config.Cluster.NodeNameFor
		return ch, nil, nil
	}
	permit, err := w.opts.Store.Acquire(ctx, high)
	if err != nil {
		return consul.Change{}, nil, err
	}
	var again *syncResult
	if w.events.Load() != gen {
		ch2, r, err := w.look()
		again = &r
		if err != nil || r.invalid {
			permit.Release()
			return consul.Change{}, again, err
		}
		ch = ch2
	}
	if ch.Empty() {
		permit.Release()
		return ch, again, nil
	}
	ch.High, ch.Permit = high, permit
	ch.NodeFor = w.opts.Config.Cluster.NodeNameFor
	return ch, again, nil
}

// waitBudgetFirst waits for the write budget before the flush when the
// worker owns nothing in Consul (a cold start, a new Service): its change
// can then only register instances, at the priority the flush would ask
// for (an isolated flush high, else bulk; there is nothing to remove), so
// waiting before the look instead of after it changes no order. What it
// saves: 10,000 Services of a cold start waiting for the budget each held
// their computed desired state and change while they waited, 62 of the
// 175 MiB of live heap at the cold start's peak (make bench, 10,000 x
// 10). The look then runs once the permit is there and sees the latest
// state; a flush that finds nothing to write gives the permit back. A
// worker that owns entries looks first: most of its looks (a restart, a
// resync) write nothing and need no budget. So does a worker whose last
// look found nothing to write (a Service without endpoints, or with
// annotations it cannot use): a look that writes nothing must not cost a
// rate token of --consul-max-writes-per-second, or a high-priority wait
// ahead of real writes, on each of its Service's changes. The error is
// ctx's.
func (w *Worker) waitBudgetFirst(ctx context.Context, s *scheduler) error {
	if !w.ownedKnown || len(w.owned) > 0 || w.resyncDue || w.lookedEmpty || w.early != nil {
		return nil
	}
	w.setState(StateFlushing)
	permit, err := w.opts.Store.Acquire(ctx, s.isolated)
	if err != nil {
		return err
	}
	w.early = &permit
	return nil
}

// look computes the desired state and its diff against the owned state,
// on a short-lived goroutine (deep); the result counts the desired
// instances.
func (w *Worker) look() (ch consul.Change, res syncResult, err error) {
	w.opts.Looks.acquire()
	defer w.opts.Looks.release()
	deep(func() {
		var desired []consul.Instance
		desired, res, err = w.desired()
		res.desired = len(desired)
		if err == nil && !res.invalid {
			ch = Diff(desired, w.owned, w.nodeOf, w.mark)
		}
	})
	return ch, res, err
}

// nodeOf names the Consul node an instance of this cluster belongs on. An
// instance of ours stays where it is when someone else's entry holds its
// ID on the node it would move to (the create there would fail every
// flush of the Service).
func (w *Worker) nodeOf(id string) string {
	home := w.opts.Config.Cluster.NodeNameFor(id)
	if f, taken := w.foreign[id]; taken && f.Node == home {
		if have, ours := w.owned[id]; ours {
			return have.Node
		}
	}
	return home
}

func (w *Worker) selected() bool {
	_, sel := w.opts.Lookup()
	return sel
}

// desired returns the stamped instances wanted in Consul: none when the
// Service is gone or not selected. An invalid Service keeps what it has.
func (w *Worker) desired() ([]consul.Instance, syncResult, error) {
	w.desiredName = ""
	svc, selected := w.opts.Lookup()
	if svc == nil || !selected {
		return nil, syncResult{}, nil
	}
	spec, err := Desired(svc, w.opts.Config)
	res := syncResult{window: &spec.Window}
	before := w.reported
	w.reported = make(map[string]bool)
	if err != nil {
		res.invalid = true
		res.problem = err.Error()
		w.report(svc, before, ReasonInvalidAnnotation, err.Error())
		return nil, res, nil
	}
	for _, warn := range spec.Warnings {
		w.report(svc, before, ReasonInvalidAnnotation, warn)
	}
	for _, msg := range spec.Skipped {
		w.report(svc, before, ReasonInstanceSkipped, msg)
	}
	w.desiredName = spec.Name
	if w.opts.OnName != nil {
		w.opts.OnName(spec.Name, svc.Annotations[AnnotationName] == "")
	}
	instances, blocked := Unblocked(spec.Instances, w.owned, w.foreign, w.nodeOf)
	for _, msg := range blocked {
		w.report(svc, before, ReasonEntryNotOurs, msg)
	}
	res.blocked = len(blocked)
	for _, p := range svc.Problems {
		w.report(svc, before, ReasonEndpointSkipped, p)
	}
	return instances, res, nil
}

// report sends a Warning event and log line for msg unless it was reported
// for the previous look (before) already.
func (w *Worker) report(svc *k8s.Service, before map[string]bool, reason, msg string) {
	if w.reported[msg] {
		return
	}
	w.reported[msg] = true
	if before[msg] {
		return
	}
	w.log.Warn("Service cannot be synced as it is", "reason", reason, "error", msg)
	if w.opts.Reporter != nil && svc.Object != nil {
		w.opts.Reporter.Warning(svc.Object, reason, msg)
	}
}

func (w *Worker) readOwned(ctx context.Context) error {
	c := w.opts.Config.Cluster
	var entries []consul.Registered
	var err error
	deep(func() { entries, err = w.opts.Store.ReadPrefix(ctx, c.IDPrefix(w.opts.Key.Namespace, w.opts.Key.Name)) })
	if err != nil {
		return fmt.Errorf("read owned state: %w", err)
	}
	w.verified = nil // a read by node: no name's index
	w.owned = OwnedOf(c, w.opts.Key, entries)
	w.foreign = ForeignOf(c, w.opts.Key, entries)
	w.ownedKnown = true
	w.log.Trace("Read the owned state by ID prefix", "owned", len(w.owned), "foreign", len(w.foreign))
	return nil
}

// lossEvidence compares the entries a worker held with a fresh read: an
// entry now older than written, or gone, was lost by Consul (or deleted by
// someone: either way every worker should look). "" when there is none.
func lossEvidence(held, now map[string]Held, foreign map[string]consul.Registered) string {
	older, gone := 0, 0
	example := ""
	for id, h := range held {
		if _, taken := foreign[id]; taken {
			continue // re-registered by someone else: not a loss
		}
		n, ok := now[id]
		switch {
		case !ok:
			gone++
			if example == "" {
				example = fmt.Sprintf("%s (written at index %d) is gone", id, h.ServiceIndex)
			}
		case n.ServiceIndex < h.ServiceIndex:
			older++
			example = fmt.Sprintf("%s was written at index %d and is at index %d", id, h.ServiceIndex, n.ServiceIndex)
		}
	}
	if older == 0 && gone == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d entries older than written, %d gone; e.g. %s", older, len(held), gone, example)
}

func (w *Worker) merge(a consul.Applied) {
	for _, id := range a.Deleted {
		delete(w.owned, id)
	}
	for _, r := range a.Written {
		w.owned[r.ID] = Hold(r)
	}
}

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
