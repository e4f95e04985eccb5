// Command fleetsync keeps the Consul catalog equal to the endpoints of
// annotated Kubernetes Services.
//
//	fleetsync --cluster-id=ID [flags]   the daemon (docs/configuration.md)
//	fleetsync status [flags]            what this cluster holds in Consul
//	fleetsync purge [flags]             remove this cluster's entries
//	fleetsync --version
//
// # Contract
//
// This package holds flags (each also FLEETSYNC_<FLAG>), their validation,
// the wiring of the components, signals (SIGTERM and SIGINT stop the daemon
// gracefully: pending changes are flushed, nothing is deregistered), the
// HTTP endpoints (/healthz, /readyz, /metrics, /debug), the Go memory
// defaults and the printing of status and purge. It holds no Consul or
// Kubernetes logic and imports no Consul API client: what to read, write
// and delete is decided in k8s, supervisor (and supervisor/shard), worker,
// ownership and consul.
//
// Every long-running part (informers, supervisor, shard manager, Consul
// health, token source, claim keeper) runs in one errgroup: an error of one
// stops the process with that error, and /readyz fails until the bootstrap
// is done (and, with --shards > 1, the shard manager's first reconcile),
// while Consul is unreachable past --consul-unreachable-grace, while the
// cluster id's claim is held by another cluster, or while a problem keeps
// the fleet from syncing every Service (a look-alike node).
//
// Exit codes: 0 after a clean stop or --help/--version, 2 for a bad flag or
// configuration (the message names the flag), 1 for any other error.
package main
