// Package shard decides which shards of a cluster's Services this replica
// syncs, when several replicas share one cluster (--shards N). It owns the
// cluster's Kubernetes Leases: it is the only reader and the only writer of
// coordination.k8s.io Leases in fleetsync.
//
// Every Service belongs to shard Of(key, N) = fnv32a("namespace/name") mod
// N. Kubernetes Leases in one namespace are the only coordination; there is
// no consensus of fleetsync's own:
//
//   - Replica Leases, fleetsync-<cluster>-replica-<id>: each replica creates
//     and renews its own every retry period (renewPresence) and deletes it
//     when it stops. The live replicas are those whose Lease was seen to
//     change within two retry periods and a second. A replica Lease
//     unchanged for 20 lease durations (a replica killed for good) may be
//     deleted by any replica, conditional on the version seen.
//   - Shard Leases, fleetsync-<cluster>-shard-<k>: held through client-go
//     leader election. A replica holds at most ceil(N / live replicas)
//     shards and hands the extra ones over when replicas join.
//
// Every replica watches all Leases of its cluster (one informer) and notes,
// by its own clock (the Lease's timestamps are never compared with local
// time), when each one last changed. Decide, a pure function of that view
// and of the elections running here, says which shards to hand over, keep,
// run for, resume and take over; Manager.Run carries it out on every
// holder change, every retry period and when a Lease held elsewhere
// expires.
//
// # Who writes a shard Lease, and when
//
// In one replica, exactly one component writes a given shard Lease at a
// time:
//
//   - its client-go election, while it runs here (started for a free
//     shard, a Lease naming this replica, or one just taken over); it
//     creates, acquires and renews the Lease, and never releases it
//     (ReleaseOnCancel is off);
//   - otherwise the Manager's own writes, each only while no election for
//     the shard runs here (a write attempted while one does is refused and
//     logged as a bug): takeOver, an update naming this replica of an
//     expired Lease, conditional on the version that was seen unchanged for
//     a lease duration; and release, clearing the holder of a Lease that
//     still names this replica, after its election was stopped and awaited.
//
// Elections are started and awaited only by Run's loop, the goroutine that
// makes the hand-written writes (at shutdown, after the loop, one
// goroutine per shard), so no election can start between that check and the
// write.
//
// # Why no two replicas ever run one Service's worker
//
//   - A holder that cannot renew a shard Lease stops the shard's workers
//     (Fleet.LoseShard returns once they have ended) at the latest
//     RetryPeriod + RenewDeadline after its last successful renewal
//     (client-go's renew loop); a replica that gives a shard up stops its
//     workers before it releases the Lease.
//   - Nobody else takes a held Lease before it has been seen unchanged for
//     LeaseDuration, measured on the taker's own clock from when it saw the
//     holder's last renewal; Config.Validate refuses timings where
//     RetryPeriod + RenewDeadline is not below LeaseDuration.
//   - Every take-over is an update conditional on the version that expired;
//     when two replicas race, the API server lets one through, and a replica
//     whose store already holds a newer version does not update it at all.
//
// Behind these, Consul's CAS (every write conditional on the index the
// worker read) keeps a worker that still ran from overwriting the new
// holder's writes, and each shard's fencing token in Consul (consul/fence,
// taken by the Fleet as it gains the shard) refuses every transaction of
// a replica that froze past its Lease: Manager.Fenced then hands the shard
// over.
//
// # Clocks and errors
//
// Deps.Clock drives every timer and timestamp of the Manager (retry tick,
// expiry timer, sightings, Lease times it writes), so Run is tested under a
// fake clock. client-go's election (v0.37) takes no clock: its retry and
// renew-deadline timers are real time.
//
// Run returns an error, to stop the process, when it cannot work: the
// Leases cannot be listed or watched, or this replica's Lease cannot be
// written, because the API server forbids it (403: RBAC): at the first 403
// when that request was never answered, else once its 403s have lasted a
// lease duration (a restarted kube-apiserver answers 403 until its RBAC
// cache has synced). Other failures (the API server unreachable) are
// retried. Ready is false until the first
// reconcile after the fleet's bootstrap is done, so a replica whose Lease
// watch never syncs, or whose replica Lease was never written, is not
// ready.
//
// RBAC: get, list, watch, create, update and delete on
// coordination.k8s.io leases in the Lease namespace.
package shard
