package watch

import (
	"context"
	"time"

	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/backoff"
)

// Next applies the index rules to an answer with index got to a query
// that waited on prev: changed is false for a return that is not a change
// (got == prev, prev != 0); next is the index of the next query.
func Next(prev, got uint64) (next uint64, changed bool) {
	switch {
	case got == 0:
		return 1, true // full re-read, but block on the next query
	case got < prev:
		return 0, true // went back: the answer is whole; read again from scratch
	case got == prev && prev != 0:
		return prev, false
	default:
		return got, true
	}
}

// Fetch is one blocking query waiting on index.
type Fetch[T any] func(ctx context.Context, index uint64) (T, uint64, error)

// LoopOptions configure Loop.
type LoopOptions struct {
	Clock   clock.Clock    // default: real
	Backoff backoff.Policy // default: 250ms to 30s, 20 % jitter
	// OnError, when set, is told every failed query (ctx errors excluded).
	OnError func(err error, failures int)
}

// Loop runs fetch until ctx is done and calls deliver with every answer
// that is a change (see Next), in order, on the caller's goroutine.
func Loop[T any](ctx context.Context, fetch Fetch[T], deliver func(T), opts LoopOptions) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Backoff.Min <= 0 {
		opts.Backoff = backoff.Policy{Min: 250 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.2}
	}
	var index uint64
	failures := 0
	for ctx.Err() == nil {
		v, got, err := fetch(ctx, index)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			// The next query starts from 0: the server that answers it may
			// be a restarted one whose index is lower, and a query with the
			// old index would block there until its wait ends.
			index = 0
			if opts.OnError != nil {
				opts.OnError(err, failures)
			}
			t := opts.Clock.NewTimer(opts.Backoff.Delay(failures))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
			continue
		}
		failures = 0
		next, changed := Next(index, got)
		index = next
		if changed {
			deliver(v)
		}
	}
}
