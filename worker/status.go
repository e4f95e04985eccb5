package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetsync/fleetsync/consul"
)

// State is what a worker is doing.
type State string

// Worker states.
const (
	StateWaiting    State = "waiting"     // waiting for the fleet to bootstrap
	StateIdle       State = "idle"        // in sync, nothing pending
	StatePending    State = "pending"     // a change waits for the window
	StateFlushing   State = "flushing"    // writing to Consul
	StateBackingOff State = "backing-off" // last flush failed; retry scheduled
	StateInvalid    State = "invalid"     // annotations unusable; Consul left as it is
)

// Status is a snapshot of a worker for metrics and /debug/workers.
type Status struct {
	Namespace  string            `json:"namespace"`
	Service    string            `json:"service"`
	State      State             `json:"state"`
	Window     time.Duration     `json:"-"`
	WindowText string            `json:"window"`
	Desired    int               `json:"desired"`
	Registered int               `json:"registered"`
	Pending    bool              `json:"pending"`
	Events     uint64            `json:"events"`
	Flushes    uint64            `json:"flushes"` // flushes that wrote or failed
	Looks      uint64            `json:"looks"`   // passes over the state, flushes included
	LastFlush  time.Time         `json:"lastFlush,omitzero"`
	LastError  string            `json:"lastError,omitempty"`
	Failures   int               `json:"consecutiveFailures,omitempty"`
	Ops        OpCounts          `json:"instanceWrites"`
	Conflicts  uint64            `json:"casConflicts"`
	Blocked    int               `json:"blockedByForeignEntries,omitempty"` // desired instances whose ID someone else's entry holds
	Errors     uint64            `json:"flushErrors"`
	Retries    uint64            `json:"retries"`
	Resyncs    uint64            `json:"antiEntropyPasses"`
	Repairs    uint64            `json:"driftRepairs"`
	Latency    Histogram         `json:"-"` // change-to-Consul latency, seconds
	Coalesced  Histogram         `json:"-"` // events per flush
	Instances  []consul.Instance `json:"instances,omitempty"`
}

// OpCounts counts instances written, by kind.
type OpCounts struct {
	Register   uint64 `json:"register"`
	Update     uint64 `json:"update"`
	Deregister uint64 `json:"deregister"`
}

// Observer receives a worker's measurements (metrics). Calls come from the
// worker's goroutines and must not block.
type Observer interface {
	Event()
	Conflict()
	// Flushed is called after every pass over the state; Flush.Wrote and
	// Flush.Err tell a real flush from a look that found nothing to write.
	Flushed(f Flush)
}

// Flush describes one flush for an Observer.
type Flush struct {
	Coalesced  uint64 // events folded into it
	Applied    consul.Applied
	Err        error
	Latency    time.Duration // from the first pending change to commit; 0 if unknown
	Desired    int
	Registered int
	Window     time.Duration
	Wrote      bool
	Resync     bool // an anti-entropy pass; if it wrote, it repaired drift
}

type nopObserver struct{}

func (nopObserver) Event()        {}
func (nopObserver) Conflict()     {}
func (nopObserver) Flushed(Flush) {}

// Status returns a snapshot of the worker.
func (w *Worker) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.status
	s.Events = w.events.Load()
	s.Pending = w.pendingSince.Load() != 0 || s.State == StatePending || s.State == StateBackingOff
	s.WindowText = s.Window.String()
	s.Latency = s.Latency.clone()
	s.Coalesced = s.Coalesced.clone()
	return s
}

func (w *Worker) setState(st State) {
	w.mu.Lock()
	if w.status.State != StateInvalid || st != StateIdle {
		w.status.State = st
	}
	w.mu.Unlock()
}

// record updates the status and the observer after a flush.
func (w *Worker) record(ctx context.Context, now time.Time, since int64, coalesced uint64, res syncResult, err error, s *scheduler) {
	var latency time.Duration
	if since != 0 && err == nil && res.applied.Txns > 0 {
		latency = now.Sub(time.Unix(0, since))
	}
	wrote := res.applied.Txns > 0
	flushed := wrote || err != nil
	w.mu.Lock()
	w.status.Looks++
	if flushed {
		w.status.Flushes++
		w.status.LastFlush = now
		w.status.Coalesced.Observe(float64(coalesced))
		if w.status.Failures > 0 {
			w.status.Retries++
		}
	}
	if err != nil {
		w.status.Errors++
	}
	if latency > 0 {
		w.status.Latency.Observe(latency.Seconds())
	}
	if res.resync && err == nil {
		w.status.Resyncs++
		if wrote {
			w.status.Repairs++
		}
	}
	w.status.Ops.Register += uint64(res.applied.Registered)
	w.status.Ops.Update += uint64(res.applied.Updated)
	w.status.Ops.Deregister += uint64(res.applied.Deregistered)
	w.status.Window = s.Window
	w.status.Registered = len(w.owned)
	w.status.Failures = s.Failures
	if !res.invalid && !res.skipped {
		w.status.Desired = res.desired
		w.status.Blocked = res.blocked
	}
	switch {
	case res.skipped && err == nil:
		// What the last look found (an invalid Service, say) stands.
		if res.before != "" {
			w.status.State = res.before
		}
	case err != nil:
		w.status.LastError = err.Error()
		w.status.State = StateBackingOff
	case res.invalid:
		w.status.LastError = res.problem
		w.status.State = StateInvalid
	default:
		w.status.LastError = ""
		w.status.State = StateIdle
	}
	desired, registered := w.status.Desired, w.status.Registered
	w.mu.Unlock()

	switch {
	case err != nil && ctx.Err() != nil:
		// Stopping: not a failure worth a log line.
	case errors.Is(err, consul.ErrFenced):
		w.log.Warn("Write refused: another replica took the shard; stopping without a retry", "error", err)
	case err != nil:
		var pe *PanicError
		if errors.As(err, &pe) {
			w.log.Error("Worker panicked during flush", "panic", pe.Value, "stack", pe.Stack)
		} else {
			w.log.Warn("Flush failed; will retry", "failures", s.Failures, "error", err)
		}
		if s.Failures == failuresBeforeEvent {
			w.reportFailure(err)
		}
	case wrote:
		w.log.Debug("Flushed", "registered", res.applied.Registered, "updated", res.applied.Updated,
			"deregistered", res.applied.Deregistered, "txns", res.applied.Txns, "latency", latency)
	}
	w.opts.Observer.Flushed(Flush{
		Coalesced: coalesced, Applied: res.applied, Err: err, Latency: latency, Desired: desired,
		Registered: registered, Window: s.Window, Wrote: wrote, Resync: res.resync,
	})
}

// failuresBeforeEvent consecutive failed flushes make a Kubernetes Event
// (once per streak): a Consul refusal the user may have to fix (ACLs, say).
const failuresBeforeEvent = 5

func (w *Worker) reportFailure(err error) {
	svc, _ := w.opts.Lookup()
	if svc == nil || svc.Object == nil || w.opts.Reporter == nil {
		return
	}
	w.opts.Reporter.Warning(svc.Object, ReasonSyncFailed,
		fmt.Sprintf("%d consecutive Consul writes failed, still retrying: %v", failuresBeforeEvent, err))
}
