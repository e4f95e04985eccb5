// Package supervisor runs the fleet: it decides which Services are synced,
// starts one worker goroutine per synced Service, routes each Kubernetes
// event to its worker, and owns the lifecycle and readiness of the whole
// fleet. It never writes to Consul itself (with shards, the fencing token
// of a shard it gains is taken through Options.Fencing: consul/fence). Whether Consul lost data is
// package supervisor/loss's to find; told of a loss, the supervisor has
// every worker repair its Service from one read (repair.go).
//
// Lifecycle of Run:
//
//  1. Starting: the informers start and sync; the owned Consul state (every
//     entry on our nodes carrying our mark) is read once for the whole
//     fleet (Store.ReadNode: one request listing our nodes, then each
//     node's services and checks, up to two requests per node, four nodes
//     at a time), retried with backoff while Consul is unreachable. Nothing
//     is written and nothing is deregistered before both are complete.
//  2. Running (Bootstrapped reports true): a worker runs for every selected
//     Service and for every Service that still has owned instances in Consul
//     (one deleted while fleetsync was down, say: its worker deregisters them
//     and ends). Events only schedule work (Notify); workers read the cached
//     state themselves. A worker that panics is reported and restarted with
//     backoff; the others are unaffected.
//  3. Stopping (ctx done): every worker gets one last flush of a pending
//     change (bounded by Config.DrainTimeout), nothing is deregistered
//     because of the stop, and Run returns once every goroutine it started
//     has ended.
//
// Selection ("is this Service mine") is one function, Supervisor.wants: the
// type (ExternalName is never synced), the namespace allow/deny lists (deny
// wins) and the consul.hashicorp.com/service-sync annotation, else
// Config.DefaultSync.
package supervisor
