// Package window holds the window rules every per-unit worker follows
// (package worker for Kubernetes -> Consul, worker/tok8s for Consul ->
// Kubernetes), as a pure scheduler: times are passed in, nothing waits.
//
//   - Leading edge: a change that arrives when the last flush completed at
//     least Window ago is flushed at once.
//   - Coalescing: changes within Window of the last flush are folded into
//     one flush at the window's end.
//   - Max delay: a pending change waits at most Window after the previous
//     flush completed.
//   - Errors: a failed flush is retried after max(Window, backoff), the
//     backoff doubling from MinBackoff to MaxBackoff with 80-120% jitter.
package window
