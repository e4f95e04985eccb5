package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// allScenarios in the order they run (the order matters: later scenarios
// reuse the Services and the daemon earlier ones left).
var allScenarios = []string{"cold-start", "idle", "memory", "restart", "latency", "rollout", "churn", "limit", "replicas", "to-k8s", "to-k8s-https", "inprocess"}

// options are the command-line flags.
type options struct {
	services, endpoints int
	consulNodes         int
	consulServers       int
	scenarios           []string
	quick               bool
	out                 string

	idle                 time.Duration
	latencySamples       int
	churnServices        int
	churnFor             time.Duration
	churnBudget          float64
	memoryLarge          int
	inprocServices       int
	inprocEndpoints      int
	inprocShard          int
	rolloutEndpoints     int
	replicaServices      int
	replicas             int
	replicaShards        int
	tok8sServices        int
	tok8sInstances       int
	tok8sLarge           int
	tok8sIdle            time.Duration
	tok8sReplicaServices int
	keepLogs             bool
	daemonEnv            []string // --daemon-env
	daemonArgs           []string // --daemon-arg
	pprof                bool
	steady               bool
	perfDoc              string // --performance-doc
	renderFrom           string // --render-from
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./test/bench [flags]\n\n"+
			"Benchmarks fleetsync against a real kube-apiserver + etcd and Consul on loopback.\n"+
			"Scenarios: %s.\n\nFlags:\n", strings.Join(allScenarios, ", "))
		fs.PrintDefaults()
	}
	fs.IntVar(&o.services, "services", 0, "Services for cold start, idle, memory, restart, latency (default 1000; 100 with --quick)")
	fs.IntVar(&o.endpoints, "endpoints", 0, "ready endpoints per Service (default 10; 5 with --quick)")
	scen := fs.String("scenarios", "all", "comma-separated scenarios to run: all, or any of "+strings.Join(allScenarios, ","))
	fs.BoolVar(&o.quick, "quick", false, "small sizes for a fast smoke run (100 x 5, 20 latency samples, 10 s churn, ...)")
	fs.StringVar(&o.out, "out", "out/bench", "directory for results.json and the plots")
	fs.DurationVar(&o.idle, "idle", 0, "idle measurement interval (default 60s; 10s with --quick)")
	fs.IntVar(&o.latencySamples, "latency-samples", 0, "isolated changes to time (default 200; 20 with --quick)")
	fs.IntVar(&o.churnServices, "churn-services", 0, "Services changing once per second in the churn scenario (default min(1000, --services))")
	fs.DurationVar(&o.churnFor, "churn-duration", 0, "how long the churn lasts (default 60s; 10s with --quick)")
	fs.Float64Var(&o.churnBudget, "churn-budget", 100, "--consul-max-writes-per-second of the churn scenario's daemon")
	fs.IntVar(&o.memoryLarge, "memory-large", 0, "second memory point, in Services: a second cold start (default 2000; 500 with --quick; <= --services skips it; 10000 takes ~30 min)")
	fs.IntVar(&o.inprocServices, "inprocess-services", 0, "Services of the in-process scenario (default 100000; 2000 with --quick)")
	fs.IntVar(&o.inprocEndpoints, "inprocess-endpoints", 0, "endpoints per Service in the in-process scenario (default 1: Consul must hold them all)")
	fs.IntVar(&o.inprocShard, "inprocess-shard", 1000, "Services per cluster id (Consul node) in the in-process scenario")
	fs.IntVar(&o.rolloutEndpoints, "rollout-endpoints", 0, "endpoints of the rolled-out Service, replaced 25 every 500 ms (default 900; 200 with --quick)")
	fs.IntVar(&o.replicaServices, "replicas-services", 0, "Services of the replicas scenario (default 3000; 200 with --quick; 30000 is the 300,000-instance point: about 15 min on 2 cores)")
	fs.IntVar(&o.replicas, "replicas", 3, "replicas of the replicas scenario")
	fs.IntVar(&o.replicaShards, "replica-shards", 6, "--shards of the replicas scenario")
	fs.IntVar(&o.tok8sServices, "to-k8s-services", 0, "Consul services of the to-k8s scenario (default 1000; 100 with --quick)")
	fs.IntVar(&o.tok8sInstances, "to-k8s-instances", 0, "instances per Consul service in the to-k8s scenario (default 10; 5 with --quick)")
	fs.IntVar(&o.tok8sLarge, "to-k8s-large", 0, "instances of the to-k8s scenario's one large service (default 10000; 1000 with --quick)")
	fs.IntVar(&o.tok8sReplicaServices, "to-k8s-replica-services", 0, "Consul services the to-k8s scenario mirrors last with --replicas replicas and --replica-shards shards (default 5000; 200 with --quick)")
	fs.DurationVar(&o.tok8sIdle, "to-k8s-idle", 0, "idle interval of the to-k8s scenario (default 10m; 10s with --quick)")
	fs.IntVar(&o.consulNodes, "consul-nodes", 0, "the daemons' --consul-nodes (default: not set, the daemon's default)")
	fs.IntVar(&o.consulServers, "consul-servers", 1, "Consul server agents with data dirs, as in production (0: one `consul agent -dev`, in memory; a dev agent also indents every JSON answer, 2.2x the bytes of a server's)")
	fs.BoolVar(&o.pprof, "pprof", false, "run the daemons with --enable-pprof; save a heap profile at each memory point (<out>/heap-<services>.pb.gz) and CPU profiles of each cold start, the restart and an idle stretch (<out>/cpu-*.pb.gz); Consul runs with enable_debug and its CPU profiles of each cold start and the restart go to <out>/consul-cpu-*.pb.gz")
	fs.BoolVar(&o.steady, "idle-steady", true, "idle measures the first anti-entropy passes (3 min after the daemon's start) and steady state, once every worker made its first pass (8 min after it); off (--quick too): one measure right after the cold start")
	fs.Func("daemon-env", "NAME=VALUE added to the daemons' environment (repeatable), e.g. GOGC=100 to compare the runtime's settings", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want NAME=VALUE, got %q", v)
		}
		o.daemonEnv = append(o.daemonEnv, v)
		return nil
	})
	fs.Func("daemon-arg", "a flag added to the daemons' command line (repeatable), e.g. --daemon-arg=--node-check-interval=0 to weigh what a default costs", func(v string) error {
		if !strings.HasPrefix(v, "-") {
			return fmt.Errorf("want a flag, got %q", v)
		}
		o.daemonArgs = append(o.daemonArgs, v)
		return nil
	})
	fs.StringVar(&o.perfDoc, "performance-doc", "", "after a run that succeeded, replace this file with the run's figures as markdown (make bench: docs/performance.md)")
	fs.StringVar(&o.renderFrom, "render-from", "", "run nothing: render these results.json files (comma-separated, runs of different scenarios) into --performance-doc")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the daemons' log directories (they are kept anyway after a failure)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.renderFrom != "" && o.perfDoc == "" {
		return o, fmt.Errorf("--render-from=%s: needs --performance-doc, the file to write", o.renderFrom)
	}
	def := func(v *int, full, quick int) {
		if *v <= 0 {
			*v = full
			if o.quick {
				*v = quick
			}
		}
	}
	defDur := func(v *time.Duration, full, quick time.Duration) {
		if *v <= 0 {
			*v = full
			if o.quick {
				*v = quick
			}
		}
	}
	def(&o.services, 1000, 100)
	def(&o.endpoints, 10, 5)
	def(&o.latencySamples, 200, 20)
	def(&o.memoryLarge, 2000, 500)
	def(&o.inprocServices, 100000, 2000)
	def(&o.inprocEndpoints, 1, 1)
	def(&o.rolloutEndpoints, 900, 200)
	def(&o.replicaServices, 3000, 200)
	def(&o.tok8sServices, 1000, 100)
	def(&o.tok8sInstances, 10, 5)
	def(&o.tok8sLarge, 10000, 1000)
	def(&o.tok8sReplicaServices, 5000, 200)
	if o.quick {
		o.steady = false
	}
	if o.replicas < 1 || o.replicaShards < o.replicas {
		return o, fmt.Errorf("--replicas=%d --replica-shards=%d: at least one replica, and at least as many shards", o.replicas, o.replicaShards)
	}
	def(&o.churnServices, min(1000, o.services), min(100, o.services))
	defDur(&o.idle, 60*time.Second, 10*time.Second)
	defDur(&o.churnFor, 60*time.Second, 10*time.Second)
	defDur(&o.tok8sIdle, 10*time.Minute, 10*time.Second)
	if o.tok8sInstances > 100 || o.tok8sServices > 25000 || o.tok8sReplicaServices > 25000 || o.tok8sLarge > 250000 {
		return o, fmt.Errorf("--to-k8s-instances=%d --to-k8s-services=%d --to-k8s-large=%d: at most 100, 25000 and 250000 (unique addresses)", o.tok8sInstances, o.tok8sServices, o.tok8sLarge)
	}
	if o.churnServices > o.services {
		return o, fmt.Errorf("--churn-services=%d: at most --services (%d)", o.churnServices, o.services)
	}
	if o.inprocShard < 1 {
		return o, fmt.Errorf("--inprocess-shard=%d: must be positive", o.inprocShard)
	}
	if o.rolloutEndpoints < 25 || o.rolloutEndpoints%25 != 0 {
		return o, fmt.Errorf("--rollout-endpoints=%d: must be a positive multiple of 25", o.rolloutEndpoints)
	}
	if o.endpoints > 100 {
		return o, fmt.Errorf("--endpoints=%d: at most 100 (one EndpointSlice per Service)", o.endpoints)
	}
	if *scen == "all" {
		o.scenarios = allScenarios
	} else {
		for _, s := range strings.Split(*scen, ",") {
			s = strings.TrimSpace(s)
			if !slices.Contains(allScenarios, s) {
				return o, fmt.Errorf("--scenarios: unknown scenario %q (have %s)", s, strings.Join(allScenarios, ", "))
			}
			o.scenarios = append(o.scenarios, s)
		}
	}
	return o, nil
}

func (o options) has(s string) bool { return slices.Contains(o.scenarios, s) }

// needsKube reports whether any chosen scenario needs the API server.
func (o options) needsKube() bool {
	return slices.ContainsFunc(o.scenarios, func(s string) bool { return s != "inprocess" })
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if o.renderFrom != "" {
		if err := renderFile(o.renderFrom, o.perfDoc); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }() // a second Ctrl-C kills at once; the servers die with us (Pdeathsig)
	if err := run(ctx, o); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "\nbench interrupted; everything it started is stopped")
		} else {
			fmt.Fprintf(os.Stderr, "\nbench failed: %v\n", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
	start := time.Now()
	b := &bench{ctx: ctx, opts: o, res: newResults(o)}
	defer func() {
		b.teardown(err != nil && ctx.Err() == nil)
		b.res.WallSeconds = time.Since(start).Seconds()
		if werr := b.res.write(o.out); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Printf("\nresults: %s (wall time %s)\n", b.res.path(o.out), time.Since(start).Round(time.Second))
		}
		if err == nil && o.perfDoc != "" {
			if werr := writePerformance(o.perfDoc, b.res); werr != nil {
				err = werr
			} else {
				fmt.Printf("figures: %s\n", o.perfDoc)
			}
		}
	}()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	fmt.Printf("fleetsync benchmark: %s\nsource: %s\n", b.res.Machine.summary(), b.res.Versions["fleetsync"])
	fmt.Printf("scenarios: %s; %d Services x %d endpoints%s\n\n", strings.Join(o.scenarios, ","), o.services, o.endpoints,
		map[bool]string{true: " (--quick)", false: ""}[o.quick])
	if err := b.setup(); err != nil {
		return err
	}
	steps := []struct {
		name string
		fn   func() error
	}{
		{"cold-start", b.coldStart},
		{"idle", b.idle},
		{"memory", b.memorySmall},
		{"restart", b.restart},
		{"latency", b.latency},
		{"rollout", b.rollout},
		{"churn", b.churn},
		{"memory", b.memoryLarge},
		{"limit", b.limit},
		{"replicas", b.replicas},
		{"to-k8s", b.toK8s},
		{"to-k8s-https", b.toK8sHTTPS},
		{"inprocess", b.inprocess},
	}
	for _, s := range steps {
		if !o.has(s.name) {
			continue
		}
		if err := s.fn(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return b.plots()
}
