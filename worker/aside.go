package worker

import (
	"context"
	"runtime"
)

// A goroutine's stack grows to what its deepest call needs and keeps that
// size while it is parked unless less than a quarter of it is in use. A
// flush goes deep (the desired state, JSON encoding and decoding, the HTTP
// client) and, run on the worker's goroutine, would leave every worker
// parked on an 8 KiB stack for the rest of its life. So the work is split
// by depth (docs/design/decisions/goroutine-stacks.md has the figures):
//
//   - the worker's goroutine only waits and schedules (Run), on 4 KiB;
//   - each flush runs on a goroutine of its own (flushAside) that only
//     coordinates: it waits for the write budget with a shallow stack, so
//     the 10,000 flushes of a cold start that all wait for it hold 4 KiB
//     each, not 8;
//   - the deep parts (the desired state and its diff, every Consul call)
//     run on short-lived goroutines (aside) and take their stacks with
//     them.
//
// Each of these goroutines ends before the one that started it goes on. A
// panic on one is raised again on the goroutine that waits for it as a
// *PanicError that keeps the original value and the stack where it
// happened, so sync's recover and the supervisor's see it as if it had
// happened on their goroutine.

// flushAside runs flush on a goroutine of its own while the worker's
// goroutine waits.
func (w *Worker) flushAside(ctx context.Context, s *scheduler) (finished bool) {
	aside(func() { finished = w.flush(ctx, s) })
	return finished
}

// aside runs f on a short-lived goroutine and waits for it; a panic in f
// is raised again here (asPanicError).
func aside(f func()) {
	c := make(chan *PanicError, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				c <- asPanicError(p)
				return
			}
			c <- nil
		}()
		f()
	}()
	if pe := <-c; pe != nil {
		panic(pe)
	}
}

// asPanicError is a recovered panic value as a *PanicError: as it is when
// it already is one (raised again by aside), else with the stack of the
// panicking goroutine (call it in the deferred function that recovered).
func asPanicError(p any) *PanicError {
	if pe, ok := p.(*PanicError); ok {
		return pe
	}
	buf := make([]byte, 8<<10)
	return &PanicError{Value: p, Stack: string(buf[:runtime.Stack(buf, false)])}
}
