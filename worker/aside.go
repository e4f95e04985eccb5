package worker

import (
	"context"
	"fmt"
	"runtime"
)

// A goroutine's stack grows to what its deepest call needs and keeps that
// size while it is parked unless less than a quarter of it is in use. A
// flush goes deep (the desired state, JSON encoding and decoding, the HTTP
// client) and, run on the worker's goroutine, left every worker parked on
// an 8 KiB stack for the rest of its life. So the work is split by depth:
//
//   - the worker's goroutine only waits and schedules (Run), on 4 KiB;
//   - each flush runs on a goroutine of its own (flushAside) that only
//     coordinates: it waits for the write budget with a shallow stack, so
//     the 10,000 flushes of a cold start that all wait for it hold 4 KiB
//     each, not 8;
//   - the deep parts (the desired state and its diff, every Consul call)
//     run on short-lived goroutines (deep) and take their stacks with them.
//
// make bench, 2,000 x 10: goroutine stacks 8.7 MiB for 2,052 goroutines
// idle, 16.5 MiB with the flush on the worker's goroutine. A panic on one
// of these goroutines is raised again on the one that waits for it, so
// sync's recover and the supervisor's see it as before, with the stack
// where it happened.

// flushAside runs flush on a goroutine of its own while the worker's
// goroutine waits.
func (w *Worker) flushAside(ctx context.Context, s *scheduler) bool {
	type result struct {
		finished bool
		panic    any
		stack    []byte
	}
	c := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.panic = p
				r.stack = make([]byte, 8<<10)
				r.stack = r.stack[:runtime.Stack(r.stack, false)]
			}
			c <- r
		}()
		r.finished = w.flush(ctx, s)
	}()
	r := <-c
	if r.panic != nil {
		panic(fmt.Sprintf("%v\n\nin the flush:\n%s", r.panic, r.stack))
	}
	return r.finished
}

// deep runs f on a short-lived goroutine and waits for it (see above).
func deep(f func()) {
	c := make(chan any, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				stack := make([]byte, 8<<10)
				stack = stack[:runtime.Stack(stack, false)]
				c <- fmt.Sprintf("%v\n\nin:\n%s", p, stack)
				return
			}
			c <- nil
		}()
		f()
	}()
	if p := <-c; p != nil {
		panic(p)
	}
}
