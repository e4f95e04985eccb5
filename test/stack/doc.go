// Package stack starts the real servers that fleetsync's end-to-end tests run
// against: etcd + kube-apiserver (StartKube / KubeT) and Consul (StartConsul /
// ConsulT / ConsulOptionsT), plus a generic subprocess runner (StartProcess)
// for the fleetsync daemon itself.
//
// # Consul: a dev agent or real servers
//
// By default Consul is one `consul agent -dev`: quick to start (~0.3 s),
// state in memory, so Restart means "Consul lost its data". With
// ConsulOptions.Servers = N it is N server agents (`-server
// -bootstrap-expect=N`), each with its own data dir, node name and ports, for
// the faults a dev agent cannot show: a restart with the data kept (Restart
// is a kill -9 of every server, RestartServer a SIGTERM of one), the crash of
// one server (KillServer, StopServer, StartServer), a new leader (Leader), a
// cluster that lost its data (RestartEmpty) and a snapshot restore
// (SnapshotSave, SnapshotRestore; the dev agent supports those too). A single
// server is ready in about 2 s: it elects itself first. Consul.Client talks
// to agent 0, Server(i).Client to server i alone.
//
// # What it starts
//
// Every server is a real binary from the tool cache built by
// test/tools/build.sh (see BinDir; `make tools` fills it). Each one listens on
// 127.0.0.1 only, on ports picked free at start (bind to port 0, close, pass
// the number on), and keeps its state in a temp dir of its own, so two test
// packages that run in parallel never share a port, a data dir or a Consul
// node name. If a port was grabbed by someone else between the pick and the
// bind, the whole start is retried with new ports. Readiness is always a real
// signal polled under a deadline (etcd /health, kube-apiserver /readyz,
// Consul's leader and a consistent read of each agent's own catalog node),
// never a sleep. A Consul server's restart keeps every port (its peers know
// it by them), so a port taken meanwhile fails that restart.
//
// # Who stops it
//
// The caller: Kube.Stop, Consul.Stop and Process.Stop send SIGTERM to the
// child's process group, wait a few seconds, then SIGKILL the group, wait for
// the exit and remove the temp dir. KubeT and ConsulT register that with
// t.Cleanup (and log the server's log tail when the test failed). In TestMain,
// stop the servers after m.Run and before os.Exit. Stop is idempotent.
//
// # What happens if the test process dies
//
// Every child runs in its own process group (so a terminal's Ctrl-C or a
// signal to the test's group does not reach it half-way) and with
// Pdeathsig=SIGKILL: when the test binary exits for any reason (a failed or
// panicking test, os.Exit without cleanup, `go test -timeout`, SIGKILL) the
// kernel kills every server it started. Children are forked from one OS
// thread that stays locked for the life of the process, because Linux sends
// the parent-death signal when the forking *thread* exits (golang/go#27505).
// That goroutine is the only one this package leaves running; goleak users
// ignore it with goleak.IgnoreTopFunction(stack.SpawnerFunction).
//
// The temp dirs of a process that died that way stay behind (an etcd data dir
// is ~120 MB). Each one carries the pid and start time of the process that
// made it, and the first start in the next test process removes those whose
// owner is gone (SweepStaleDirs); dirs of live processes and dirs without the
// mark are never touched.
//
// # Skipping
//
// KubeT and ConsulT skip the test under `go test -short`, so `make test-unit`
// runs without servers. When the binaries are missing they fail (not skip)
// with a message that says to run `make tools`.
package stack
