// Package backoff computes the waits of an exponential backoff: the one
// rule every retry in fleetsync follows (a worker's failed flush, the
// bootstrap read of the owned state, a crashed worker's restart, a Consul
// login, reaching Consul and claiming the cluster id at start, a blocking
// query's errors).
//
// The wait after the n-th failure in a row is Min doubled n-1 times, at
// most Max, then jittered: multiplied by a factor drawn uniformly from
// [1-Jitter, 1+Jitter), so a jittered wait may exceed Max by the jitter.
// The package only computes durations; the caller waits them on its own
// clock (an injected one in every component that tests time).
//
// It is a leaf: it imports nothing of the project. Package k8s, which
// imports nothing of the project either, uses apimachinery's wait.Backoff
// instead; wait.Backoff does not fit the others: its jitter only
// lengthens a wait (window.Jitter and the supervisor's restarts are
// symmetric), it has no wait for the n-th failure without stepping
// through the others (worker/window keeps the failure count, not a
// backoff), and its randomness cannot be injected for a test.
package backoff
