package worker

import (
	"context"
	"fmt"
	"runtime"
)

// flushAside runs flush on a goroutine of its own while the worker's
// goroutine waits. A goroutine's stack grows to what its deepest call needs
// and keeps that size while it is parked unless less than a quarter of it
// is in use; a flush goes deep (the desired state, JSON encoding and
// decoding, the HTTP client) and would leave each worker parked on an
// 8 KiB stack for the rest of its life. The worker's goroutine then only
// waits and schedules, on a 4 KiB stack (make bench, 2,000 x 10: goroutine
// stacks 8.7 MiB for 2,052 goroutines, 16.5 MiB with the flush on the
// worker's goroutine). A panic in the flush is raised again on the worker's
// goroutine, where the supervisor recovers it as before.
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
