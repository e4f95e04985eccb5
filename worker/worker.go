package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/worker/window"
)

// Worker keeps one Service's instances in Consul equal to its desired state.
// Notify may be called from any goroutine; Run runs in exactly one.
type Worker struct {
	opts    Options
	clock   clock.Clock
	log     hclog.Logger
	trigger chan struct{}
	resync  chan struct{}
	retry   chan struct{}
	adoptC  chan adoption
	// pendingSince is the unix-nano time of the oldest change not yet
	// flushed, 0 when none; events counts notifications.
	pendingSince atomic.Int64
	events       atomic.Uint64

	// Owned by the Run goroutine.
	owned       map[string]Held
	ownedKnown  bool
	mark        Mark                         // the cluster's, for the entries a diff hands the writer
	foreign     map[string]consul.Registered // someone else's entries under our IDs (see ForeignOf)
	blockedNow  int                          // desired instances the last sync left out for them
	lastWrite   time.Time                    // when the last Apply returned
	resyncDue   bool                         // the next flush is an anti-entropy pass
	early       *budget.Permit               // the budget waited for before the flush (waitBudgetFirst)
	lookedEmpty bool                         // the last flush found nothing to write
	fenced      bool                         // a write was refused on the shard's fence (ErrFenced)
	resyncTimed bool                         // ... and only the period's (see unchangedSince)
	// verified holds the indexes of the last read by name, if nothing
	// was written since: a periodic pass that finds them unmoved has
	// nothing to read (see unchangedSince).
	verified    *verification
	desiredName string // the Consul name of the last desired state
	resyncTimer clock.Timer
	// reported holds the messages reported for the last look at the
	// Service: each is reported once while it lasts.
	reported      map[string]bool
	eventsFlushed uint64 // events counted by earlier flushes

	mu     sync.Mutex
	status Status

	// atGate, when set (by tests, before Run), is called as Run starts
	// waiting for a closed Gate.
	atGate func()
}

// New returns a worker; it does nothing until Run.
func New(opts Options) *Worker {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	if opts.BlockedRecheck == 0 {
		opts.BlockedRecheck = DefaultBlockedRecheck
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = 30 * time.Second
	}
	w := &Worker{
		opts:       opts,
		clock:      opts.Clock,
		log:        opts.Log.With("namespace", opts.Key.Namespace, "service", opts.Key.Name),
		trigger:    make(chan struct{}, 1),
		resync:     make(chan struct{}, 1),
		retry:      make(chan struct{}, 1),
		adoptC:     make(chan adoption, 1),
		ownedKnown: opts.OwnedKnown,
	}
	w.owned = opts.Owned
	if w.owned == nil {
		w.owned = map[string]Held{}
	}
	w.opts.Owned = nil // the worker's state from here on: w.owned
	w.mark = MarkOf(opts.Config.Cluster)
	w.status = Status{Namespace: opts.Key.Namespace, Service: opts.Key.Name, State: StateWaiting,
		Window: opts.Config.DefaultWindow, Registered: len(w.owned),
		Latency: NewHistogram(LatencyBuckets), Coalesced: NewHistogram(CoalescedBuckets)}
	return w
}

// Key returns the Service the worker owns.
func (w *Worker) Key() k8s.Key { return w.opts.Key }

// Fence returns the fence the worker writes under (Options.Fence).
func (w *Worker) Fence() consul.Guard { return w.opts.Fence }

// Notify tells the worker to look again. It never blocks: a burst of
// notifications becomes one wake-up.
func (w *Worker) Notify() {
	w.pendingSince.CompareAndSwap(0, w.clock.Now().UnixNano())
	w.events.Add(1)
	w.opts.Observer.Event()
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// Retry ends a backoff now: the supervisor calls it when Consul answers
// again after it did not, so that a flush that failed while Consul was
// away is retried at once instead of at the end of a backoff of up to
// MaxBackoff. A worker not backing off ignores it. The failure count
// stays, so a retry that fails again backs off longer.
func (w *Worker) Retry() {
	select {
	case w.retry <- struct{}{}:
	default:
	}
}

// adoption is a read of the whole cluster's entries the supervisor made
// after Consul lost or rolled back data: this Service's share, and when the
// read started.
type adoption struct {
	held map[string]Held
	at   time.Time
}

// Adopt hands the worker its entries (HoldOwned's map for its Service,
// taken as it is) from a read of every node of the
// cluster that started at readStart, and makes it look again: after a
// loss or a restore, the cache must be replaced by what Consul holds, every
// name included (an entry a restore brought back under a Consul name the
// Service no longer has is not in a read by name). A worker that wrote
// since readStart re-reads its entries itself instead. The last adoption
// wins.
func (w *Worker) Adopt(held map[string]Held, readStart time.Time) {
	if held == nil {
		held = map[string]Held{}
	}
	a := adoption{held: held, at: readStart}
	for {
		select {
		case w.adoptC <- a:
			return
		default:
		}
		select {
		case <-w.adoptC: // replace the older one
		default:
		}
	}
}

// ErrFinished is returned by Run when the Service is no longer selected and
// none of its instances remain in Consul: the worker has nothing left to do.
var ErrFinished = errors.New("worker finished: service not synced and nothing left in consul")

// ErrFenced is returned by Run when a write was refused on the shard's
// fence (Options.Fence): another replica took the shard over. Nothing more
// is written, the refused write included.
var ErrFenced = errors.New("worker stopped: its shard was fenced by another replica")

// Run keeps the Service in sync until ctx is done (then it returns nil,
// after one last flush bounded by DrainTimeout if a change is pending), the
// Service is gone and deregistered (then it returns ErrFinished), or its
// shard was fenced (ErrFenced).
func (w *Worker) Run(ctx context.Context) error {
	if err := w.waitGate(ctx); err != nil {
		return nil
	}
	s := scheduler{Schedule: window.Schedule{Window: w.opts.Config.DefaultWindow, Dirty: true, MinBackoff: w.opts.MinBackoff, MaxBackoff: w.opts.MaxBackoff}}
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	waited := false // the pending flush waited out a window or a backoff
	var resyncC <-chan time.Time
	var blockedT clock.Timer // runs while instances are blocked
	defer func() {
		if blockedT != nil {
			blockedT.Stop()
		}
	}()
	w.resyncTimer = nil // armed by the first flush (armResync)
	defer func() {
		if w.resyncTimer != nil {
			w.resyncTimer.Stop()
		}
	}()
	for {
		var timerC <-chan time.Time
		if s.Dirty {
			wait := s.Wait(w.clock.Now())
			if wait <= 0 {
				if timer != nil {
					timer.Stop()
					timer = nil
				}
				s.isolated = !waited && s.Failures == 0
				waited = false
				if err := w.waitBudgetFirst(ctx, &s); err != nil && ctx.Err() != nil {
					w.drain(ctx, &s)
					return nil
				}
				if done := w.flushAside(ctx, &s); done {
					return ErrFinished
				}
				if w.fenced {
					return ErrFenced
				}
				switch blocked := w.blockedNow > 0 && w.opts.BlockedRecheck > 0; {
				case blocked && blockedT == nil:
					blockedT = w.clock.NewTimer(w.opts.BlockedRecheck)
				case !blocked && blockedT != nil:
					blockedT.Stop()
					blockedT = nil
				}
				continue
			}
			if timer == nil {
				timer = w.clock.NewTimer(wait)
			}
			timerC = timer.C()
			w.setState(s.state())
		} else {
			w.setState(StateIdle)
		}
		var blockedC <-chan time.Time
		if blockedT != nil {
			blockedC = blockedT.C()
		}
		if w.resyncTimer != nil {
			resyncC = w.resyncTimer.C()
		}
		select {
		case <-ctx.Done():
			w.drain(ctx, &s)
			return nil
		case <-w.trigger:
			s.Dirty = true
		case <-timerC:
			timer = nil
			waited = true
		case <-resyncC:
			w.resyncTimer.Reset(nextResync(w.opts.ResyncPeriod))
			if !w.resyncDue {
				w.resyncTimed = true
			}
			w.resyncDue, s.Dirty = true, true
		case <-w.resync:
			w.forceResync()
			s.Dirty = true
		case a := <-w.adoptC:
			if w.lastWrite.After(a.at) {
				w.ownedKnown = false // wrote meanwhile: the read may miss it
				w.log.Trace("Fleet's read older than this worker's last write; reading again")
			} else {
				w.owned = a.held
				w.verified = nil // a read by node: no name's index
				w.ownedKnown = true
				w.log.Trace("Adopted the fleet's read", "owned", len(w.owned))
			}
			w.resyncDue, w.resyncTimed = false, false // this is the pass, every name included
			s.Dirty = true
		case <-w.retry:
			if s.Failures > 0 && s.Dirty {
				s.RetryAt = w.clock.Now()
				if timer != nil {
					timer.Stop()
					timer = nil
				}
			}
		case <-blockedC:
			// Read the entries again: if the foreign entry is gone, the
			// blocked instance is registered by this flush.
			blockedT = nil
			w.ownedKnown, s.Dirty = false, true
		}
	}
}

func (w *Worker) waitGate(ctx context.Context) error {
	if w.opts.Gate == nil {
		return nil
	}
	if w.atGate != nil {
		w.atGate()
	}
	select {
	case <-w.opts.Gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrHandedOver, as the cause of Run's context (context.WithCancelCause),
// stops the worker without its final flush: another replica takes the
// Service over, and this one must not write after that.
var ErrHandedOver = errors.New("service handed over to another replica")

// drain attempts the pending flush when the worker is stopped.
func (w *Worker) drain(ctx context.Context, s *scheduler) {
	if errors.Is(context.Cause(ctx), ErrHandedOver) || w.fenced {
		return
	}
	select {
	case <-w.trigger:
		s.Dirty = true
	default:
	}
	if !s.Dirty || w.opts.DrainTimeout <= 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.DrainTimeout)
	defer cancel()
	w.flush(dctx, s)
}

// PanicError is a panic in a worker's flush: sync returns it as its
// error; one outside sync's recover reaches Run's caller as a panic with a
// *PanicError value.
type PanicError struct {
	Value any    // the value the panic was raised with
	Stack string // the stack of the goroutine that panicked
}

func (e *PanicError) Error() string { return fmt.Sprintf("worker panicked: %v", e.Value) }

// unreachable reports whether a flush failed for want of an answer from
// Consul, rather than because Consul refused the change.
func unreachable(err error) bool {
	var pe *PanicError
	return !errors.Is(err, consul.ErrConflict) && !errors.Is(err, consul.ErrRefused) && !errors.Is(err, consul.ErrFenced) && !errors.As(err, &pe)
}
