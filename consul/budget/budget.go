package budget

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// Budget is the global write budget shared by every worker: at most Rate
// transactions per second (with Burst) and at most Inflight transactions at
// once. A nil *Budget allows everything.
//
// Priority: a high-priority caller (a change that only removes instances, or
// an isolated change: the first after a quiet window) is served before any
// waiting bulk caller. Removing instances that went away protects clients
// from dead endpoints, and isolated changes are what latency is measured on;
// bulk flushes are already late by design (they coalesce), and while they
// wait their workers keep folding newer state into the same pending flush.
type Budget struct {
	lim *rate.Limiter
	sem *semaphore.Weighted

	mu          sync.Mutex
	highWaiting int
	clear       chan struct{} // closed when highWaiting drops to 0
}

// New returns a budget; perSecond <= 0 means no rate limit and
// inflight <= 0 no concurrency limit (nil if neither is set).
func New(perSecond float64, burst, inflight int) *Budget {
	if perSecond <= 0 && inflight <= 0 {
		return nil
	}
	b := &Budget{clear: make(chan struct{})}
	close(b.clear)
	if perSecond > 0 {
		if burst < 1 {
			burst = 1
		}
		b.lim = rate.NewLimiter(rate.Limit(perSecond), burst)
	}
	if inflight > 0 {
		b.sem = semaphore.NewWeighted(int64(inflight))
	}
	return b
}

// Permit is one transaction's share of the budget; Release it when the
// transaction is done. The zero Permit is valid and releases nothing.
type Permit struct {
	b      *Budget
	Waited time.Duration // time spent waiting for it
}

// Zero reports whether p is the zero Permit: no share of a budget (none
// was acquired, or the budget is nil).
func (p Permit) Zero() bool { return p.b == nil }

// Release returns the inflight slot.
func (p Permit) Release() {
	if p.b != nil && p.b.sem != nil {
		p.b.sem.Release(1)
	}
}

// Acquire waits for one transaction's budget, high-priority callers first:
// a bulk caller waits while any high-priority caller waits, and gives its
// inflight slot back if one arrived while it queued for it.
func (b *Budget) Acquire(ctx context.Context, high bool) (Permit, error) {
	if b == nil {
		return Permit{}, ctx.Err()
	}
	start := time.Now()
	if high {
		b.enterHigh()
		defer b.leaveHigh()
	}
	for {
		if !high {
			if err := b.waitNoHigh(ctx); err != nil {
				return Permit{}, err
			}
		}
		if b.sem != nil {
			if err := b.sem.Acquire(ctx, 1); err != nil {
				return Permit{}, err
			}
		}
		if high || !b.highPending() || b.sem == nil {
			break
		}
		b.sem.Release(1)
	}
	if b.lim != nil {
		if err := b.lim.Wait(ctx); err != nil {
			if b.sem != nil {
				b.sem.Release(1)
			}
			return Permit{}, err
		}
	}
	return Permit{b: b, Waited: time.Since(start)}, nil
}

func (b *Budget) highPending() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.highWaiting > 0
}

func (b *Budget) enterHigh() {
	b.mu.Lock()
	if b.highWaiting == 0 {
		b.clear = make(chan struct{})
	}
	b.highWaiting++
	b.mu.Unlock()
}

func (b *Budget) leaveHigh() {
	b.mu.Lock()
	b.highWaiting--
	if b.highWaiting == 0 {
		close(b.clear)
	}
	b.mu.Unlock()
}

func (b *Budget) waitNoHigh(ctx context.Context) error {
	for {
		b.mu.Lock()
		clear := b.clear
		n := b.highWaiting
		b.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-clear:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
