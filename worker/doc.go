// Package worker keeps one Kubernetes Service's instances in Consul equal to
// what the Service stands for: its ready endpoints, or, by type and as
// consul-k8s does, its nodes' addresses and NodePort (NodePort), its load
// balancer's ingress (LoadBalancer), its spec.externalIPs, or its Ingress
// hosts (see Desired and docs/annotations.md). Every input (endpoints,
// Service spec and status, Node addresses, Ingress rules) reaches the
// worker as the same "look again", through the same window and diff.
//
// A Worker computes the desired instances from the latest cached view of its
// Service (Desired), diffs them against the Service's owned instances in
// Consul (Diff, a pure function) and writes only the difference, through the
// consul package, as stamped values (package ownership). Work is level-based:
// Notify means "look again", never "apply this delta". worker.go holds the
// event loop (Notify, Retry, Adopt, Run); flush.go one flush as steps: the
// owned state (owned.go), a look (look.go: desired state and diff), the
// write budget (budget.go), the write; resync.go the anti-entropy pass;
// package worker/window when to flush. desired.go reads a Service's annotations and
// instances.go builds the instances of each Service type.
//
// Window rules (W is --window or the fleetsync.io/window annotation; the
// pure scheduler of package worker/window applies them, table-tested):
//
//   - Leading edge: a change that arrives when the last flush completed at
//     least W ago is flushed at once. (A flush here is a write, or a failed
//     attempt: a look that found nothing to write opens no window.)
//   - Coalescing: changes within W of the last flush are folded into one flush
//     at the window's end, which reads the latest state.
//   - Max delay: a pending change waits at most W after the previous flush
//     completed, so a service that never goes quiet is written once per W.
//   - Gate: nothing is flushed before Options.Gate is closed (bootstrap).
//   - Errors: a failed flush is retried after max(W, backoff), backoff
//     doubling from MinBackoff to MaxBackoff with 80-120% jitter
//     (consul/backoff); newer changes join the retry. A CAS conflict
//     re-reads the owned state and diffs again.
//
// A Service whose annotations cannot be used is reported (log and Event) and
// left as it is in Consul: a typo never deregisters live instances. A Service
// that is gone or not selected has its instances deregistered; then Run
// returns ErrFinished.
//
// Run returns when its context is done (after one final flush bounded by
// DrainTimeout if a change is pending). Its goroutine only waits and
// schedules: each flush runs on a goroutine of its own and the deep parts
// of a flush (the desired state and its diff, every Consul call) on
// short-lived ones (aside.go), which keeps a parked worker's stack at
// 4 KiB. Each of them ends before the goroutine that started it goes on,
// so none outlives Run; a panic on one reaches the goroutine that waits
// for it as a *PanicError holding the original value and the stack where
// it happened.
package worker
