package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

const (
	clusterID = "bench"   // the real-stack daemons' cluster id
	benchNS   = "bench"   // cold start, idle, memory, restart, latency, churn
	rolloutNS = "rollout" // the rolled-out Services
	compareNS = "compare" // the 200 x 5 cold start (consul-k8s's size)
	svcPrefix = "bench-"  // Consul service names of benchNS

	// quietConsul turns off coordinate updates, the only Raft applies a dev
	// agent makes by itself, so consul_raft_apply counts fleetsync's
	// writes alone.
	quietConsul = "-hcl=disable_coordinates = true"
)

// bench holds everything run started; teardown stops it.
type bench struct {
	ctx  context.Context
	opts options
	res  *Results

	kube   *stack.Kube
	kc     kubernetes.Interface // QPS 500, burst 1000
	consul *stack.Consul
	bin    string // the fleetsync binary fixture.Build made

	daemon  *fixture.Daemon   // the running real-stack daemon, if any
	started time.Time         // when it was spawned
	stopped []*fixture.Daemon // stopped daemons whose dirs teardown removes

	// populated is how many Services benchNS holds (bench-00000 ...);
	// converged says the running daemon has them all in Consul.
	populated int
	converged bool
	// convergedAt is when the running daemon last had every instance in
	// Consul (its workers' first syncs had ended): the anti-entropy
	// passes count from those.
	convergedAt time.Time
	slices      map[string]*sliceState // benchNS Service name -> its slice, as last written

	mem     []memPoint // memory measurements at increasing sizes
	limited bool       // a cold start of this run was measured against the limit

	// tls is Consul's HTTPS listener's throwaway CA and certificate (in
	// tlsDir), for to-k8s-https; nil without it.
	tls    *stack.TLSFiles
	tlsDir string
}

func (b *bench) logf(format string, args ...any) {
	fmt.Printf("- "+format+"\n", args...)
}

// setup starts the servers (the API server only if a scenario needs it)
// and builds the daemon.
func (b *bench) setup() error {
	bin, err := stack.BinDir()
	if err != nil {
		return err
	}
	start := time.Now()
	kubeErr := make(chan error, 1)
	go func() {
		if !b.opts.needsKube() {
			kubeErr <- nil
			return
		}
		var err error
		b.kube, err = stack.StartKube(b.ctx, stack.KubeOptions{})
		kubeErr <- err
	}()
	var cerr error
	consulArgs := []string{quietConsul}
	if b.opts.pprof {
		consulArgs = append(consulArgs, "-hcl=enable_debug = true") // its /debug/pprof
	}
	if b.opts.has("to-k8s-https") {
		// HTTPS besides plain HTTP, which every other scenario uses.
		if err := b.startTLS(); err != nil {
			return errors.Join(<-kubeErr, err)
		}
	}
	b.consul, cerr = stack.StartConsul(b.ctx, stack.ConsulOptions{ExtraArgs: consulArgs, Servers: b.opts.consulServers, TLS: b.tls})
	if err := errors.Join(<-kubeErr, cerr); err != nil {
		return err
	}
	b.res.Versions["consul"] = b.consul.Version
	if b.kube != nil {
		b.res.Versions["kube-apiserver"] = b.kube.Version
		cfg := rest.CopyConfig(b.kube.Config)
		cfg.QPS, cfg.Burst, cfg.UserAgent = 500, 1000, "fleetsync-bench"
		if b.kc, err = kubernetes.NewForConfig(cfg); err != nil {
			return err
		}
		b.logf("kube-apiserver %s at %s", b.kube.Version, b.kube.URL)
	}
	b.logf("consul %s at %s (servers from %s, up in %s)", b.consul.Version, b.consul.HTTPAddr, bin, since(start))
	if b.opts.needsKube() {
		start = time.Now()
		if b.bin, err = fixture.Build(); err != nil {
			return err
		}
		b.logf("built cmd/fleetsync (no -race) in %s", since(start))
	}
	return nil
}

// teardown stops the daemon and the servers. After a failure it prints the
// daemon's log tail and keeps its log.
func (b *bench) teardown(failed bool) {
	fmt.Println()
	b.logf("tearing down")
	if b.daemon != nil {
		if failed {
			fmt.Printf("  fleetsync log tail:\n%s\n", indent(b.daemon.LogTail(40)))
		}
		b.stopDaemon()
	}
	for _, d := range b.stopped {
		if failed || b.opts.keepLogs {
			fmt.Printf("  fleetsync log kept: %s\n", d.LogPath)
			continue
		}
		_ = os.RemoveAll(d.Dir)
	}
	if b.consul != nil {
		report("consul", b.consul.Stop())
	}
	if b.kube != nil {
		report("kube-apiserver + etcd", b.kube.Stop())
	}
	if b.bin != "" {
		_ = os.RemoveAll(filepath.Dir(b.bin))
	}
	if b.tlsDir != "" {
		_ = os.RemoveAll(b.tlsDir)
	}
}

func report(what string, err error) {
	if err != nil {
		fmt.Printf("  stopping %s: %v\n", what, err)
	}
}

// startDaemon spawns a daemon of cluster "bench" over the given namespaces
// without waiting for readiness. Everything but the log level is the
// daemon's default unless args say otherwise.
func (b *bench) startDaemon(name string, namespaces []string, args ...string) (*fixture.Daemon, error) {
	if b.daemon != nil {
		return nil, fmt.Errorf("a daemon is already running")
	}
	if b.opts.pprof {
		args = append(args, "--enable-pprof")
	}
	if b.opts.consulNodes > 0 {
		args = append([]string{fmt.Sprintf("--consul-nodes=%d", b.opts.consulNodes)}, args...)
	}
	args = append(args, b.opts.daemonArgs...)
	d, err := fixture.SpawnDaemon(b.ctx, fixture.DaemonConfig{
		ClusterID: clusterID, Kubeconfig: b.kube.KubeconfigPath, ConsulAddr: b.consul.Addr,
		Namespaces: namespaces, Name: name,
		// fixture logs at debug level (for tests); a benchmark logs as
		// production does.
		Args: append([]string{"--log-level=info"}, args...),
		Env:  b.opts.daemonEnv,
	})
	if err != nil {
		return nil, err
	}
	b.daemon, b.started = d, time.Now()
	return d, nil
}

// perWorker names the running daemon's --metrics-per-worker.
func (b *bench) perWorker() string {
	v := "top-20 (default)"
	for _, a := range b.daemon.Args {
		if s, ok := strings.CutPrefix(a, "--metrics-per-worker="); ok {
			v = s
		}
	}
	return "--metrics-per-worker=" + v
}

// stopDaemon stops the running daemon (SIGTERM, then its shutdown).
func (b *bench) stopDaemon() {
	if b.daemon == nil {
		return
	}
	report("fleetsync", b.daemon.Stop())
	b.stopped = append(b.stopped, b.daemon)
	b.daemon, b.converged = nil, false
}

// daemonArgs prints a daemon's flags as they take effect (the last of a
// repeated flag wins), without addresses and paths.
func daemonArgs(d *fixture.Daemon) string {
	var out []string
	for i, a := range d.Args {
		name, _, _ := strings.Cut(a, "=")
		if name == "--kubeconfig" || name == "--consul-address" || name == "--http-addr" {
			continue
		}
		overridden := name != "--allow-namespace" && slices.ContainsFunc(d.Args[i+1:], func(l string) bool { return strings.HasPrefix(l, name+"=") })
		if !overridden {
			out = append(out, a)
		}
	}
	return strings.Join(out, " ")
}

// applies reads Consul's running total of Raft applies.
func (b *bench) applies() (float64, error) {
	return b.consul.RaftApplies()
}

// quietApplies waits until Consul's Raft apply count has not moved for
// quiet, and returns it. A fresh agent makes a few applies of its own in
// its first second; a daemon's last flushes land a window after the last
// change.
func (b *bench) quietApplies(quiet time.Duration) (float64, error) {
	deadline := time.Now().Add(quiet + 2*time.Minute)
	last, err := b.applies()
	if err != nil {
		return 0, err
	}
	since := time.Now()
	for {
		if err := sleep(b.ctx, 250*time.Millisecond); err != nil {
			return 0, err
		}
		v, err := b.applies()
		if err != nil {
			return 0, err
		}
		if v != last {
			last, since = v, time.Now()
		}
		if time.Since(since) >= quiet {
			return v, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("consul_raft_apply still moving after %s (at %v)", quiet+2*time.Minute, v)
		}
	}
}

// restartConsul replaces Consul with a fresh, empty agent on the same address
// (no daemon may be running) and waits until it is quiet.
func (b *bench) restartConsul() error {
	if b.daemon != nil {
		return fmt.Errorf("restartConsul with a daemon running")
	}
	start := time.Now()
	if err := b.consul.RestartEmpty(b.ctx); err != nil {
		return err
	}
	if _, err := b.quietApplies(2 * time.Second); err != nil {
		return err
	}
	b.logf("fresh, empty Consul in %s", since(start))
	return nil
}

// waitReady polls the daemon's /readyz and returns when it first answered 200.
func waitReady(ctx context.Context, d *fixture.Daemon, timeout time.Duration) (time.Time, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.HTTP+"/readyz", nil)
		if err != nil {
			return time.Time{}, err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now(), nil
			}
		}
		if d.Exited() {
			return time.Time{}, fmt.Errorf("fleetsync exited before ready:\n%s", indent(d.LogTail(30)))
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("fleetsync not ready after %s:\n%s", timeout, indent(d.LogTail(30)))
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

func secs(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    | ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
