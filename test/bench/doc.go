// Command bench measures fleetsync against the real servers it syncs between:
// a kube-apiserver (+ etcd) and a Consul dev agent, both on loopback, started
// by package test/stack, with the fleetsync daemon built from cmd/fleetsync
// (without -race) and run as a subprocess by package test/fixture.
//
// Run it with `make bench` (or `go run ./test/bench`; `--quick` for a smoke
// run of a minute or two). It prints one line per figure, writes every figure
// and the raw series to <out>/results.json and draws the plots into <out>
// (PNG, with gonum/plot). With --performance-doc (make bench:
// docs/performance.md) a run that succeeded replaces that file with its
// figures, the machine and the command (perfdoc.go); --render-from renders
// an earlier run's results.json instead of running.
//
// Scenarios (--scenarios, comma-separated; default all):
//
//	cold-start  S x E selectorless Services + EndpointSlices created in the
//	            API server, then fleetsync started against an empty Consul:
//	            time until Consul holds every instance, Raft applies used,
//	            instances/s (also at 200 x 5, consul-k8s's measured size)
//	idle        Raft applies per minute while nothing changes (target 0) and
//	            the daemon's CPU seconds (/proc/<pid>/stat)
//	memory      RSS (/proc) and Go heap (the daemon's /metrics) at S and at
//	            --memory-large Services (a second cold start, also timed),
//	            and the per-Service cost derived from the two
//	restart     fleetsync restarted with nothing changed: Raft applies caused
//	            (target 0), time to ready, fewest instances seen in Consul
//	latency     isolated changes (each to a different, quiet Service): time
//	            from the EndpointSlice write returning to the change seen by a
//	            Consul blocking query; p50/p90/p99/max
//	rollout     one Service of 900 endpoints rolled over like a Deployment
//	            (every 500 ms 25 new pods ready, the 25 they replace
//	            terminating, the previous 25 gone), with W=0, W=1s and W=5s
//	            (the per-Service window annotation) one after another: Raft
//	            applies, flushes, ops, time to the final state, ratios; plot
//	            of applies over time
//	churn       1,000 Services each changing once per second for 60 s under
//	            --consul-max-writes-per-second=100: Raft applies/s (max, mean),
//	            lag of each Service's final state after the churn stops
//	limit       Consul's own limit, right after each cold start of the run:
//	            what the cold start left on the cluster's nodes (every
//	            instance's service and check, and the nodes) is read back,
//	            then written into a fresh Consul with raw /v1/txn calls
//	            shaped like fleetsync's (per Service a node op, then a
//	            service op and a check op per instance; the first
//	            transaction on a node creates it while the others wait; the
//	            same nodes; 8 in flight, the daemon's --consul-max-inflight);
//	            prints the limit's time and fleetsync's cold start as a
//	            ratio of it (limit time / fleetsync time; target >= 0.8).
//	            The main daemon is then started over the limit's entries
//	            (target: 0 catalog writes, the shapes are the same) and
//	            runs the later scenarios. Alone, it runs a cold start first
//	inprocess   in-process event source, not the real API server: the same
//	            supervisor, workers and Consul client (exported APIs) fed from
//	            an in-memory supervisor.Watcher, against the real Consul, to
//	            project 100,000 Services: cold start, idle, Go heap. Services
//	            are split over several cluster ids (Consul nodes), because
//	            Consul 1.14 slows down with the instances already on a node
//	            (docs/design/decisions/consul-nodes.md)
//
// Every server and daemon it starts is stopped on exit, on error and on
// Ctrl-C; the children also die with the process (Pdeathsig, see package
// stack). Everything listens on and talks to 127.0.0.1 only; the endpoint
// addresses written to EndpointSlices are data and are never contacted.
package main
