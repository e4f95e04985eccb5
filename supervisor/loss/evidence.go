package loss

import (
	"context"
	"slices"
	"sync"
)

// maxPending bounds the workers' evidence kept for one check: one that
// stands is enough for a loss.
const maxPending = 64

// evidence is one worker's report; stands, when set, says whether it still
// counts once Config.Confirm ran (false: its Service is another replica's
// now, whose writes it saw).
type evidence struct {
	reason string
	stands func() bool
}

// pending is the evidence reported since the last check, and the wake-up
// of Run (1-buffered: a burst of reports is one check).
type pending struct {
	mu   sync.Mutex
	evs  []evidence
	wake chan struct{}
}

// Report is a worker's evidence that Consul lost entries it wrote: the
// next check, begun at once, reports it as a loss (SignalWorker) if it
// still stands then. stands (nil: always) is asked after Config.Confirm
// ran: a worker of a shard another replica took while this one was stopped
// sees that replica's writes, which are no loss. It never blocks.
func (w *Watch) Report(reason string, stands func() bool) {
	w.evidence.mu.Lock()
	if len(w.evidence.evs) < maxPending {
		w.evidence.evs = append(w.evidence.evs, evidence{reason: reason, stands: stands})
	}
	w.evidence.mu.Unlock()
	select {
	case w.evidence.wake <- struct{}{}:
	default:
	}
}

// judgeEvidence takes the evidence pending and returns the reason of the
// first that stands ("": none). Evidence that may not stand is judged
// after Config.Confirm; when Confirm cannot tell, all of it waits for the
// next check.
func (w *Watch) judgeEvidence(ctx context.Context) string {
	w.evidence.mu.Lock()
	evs := w.evidence.evs
	w.evidence.evs = nil
	w.evidence.mu.Unlock()
	if len(evs) == 0 {
		return ""
	}
	if w.cfg.Confirm != nil && slices.ContainsFunc(evs, func(ev evidence) bool { return ev.stands != nil }) {
		if err := w.cfg.Confirm(ctx); err != nil {
			if ctx.Err() == nil {
				w.cfg.Log.Warn("Cannot confirm which Services this replica still syncs; a worker's evidence of a loss waits for the next check", "error", err, "evidence", evs[0].reason)
			}
			w.evidence.mu.Lock()
			w.evidence.evs = append(evs, w.evidence.evs...)[:min(maxPending, len(evs)+len(w.evidence.evs))]
			w.evidence.mu.Unlock()
			return ""
		}
	}
	for _, ev := range evs {
		if ev.stands == nil || ev.stands() {
			return ev.reason
		}
	}
	w.cfg.Log.Info("Evidence of a loss from workers of Services handed over meanwhile: no loss", "evidence", evs[0].reason)
	return ""
}
