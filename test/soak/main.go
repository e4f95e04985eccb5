// Command soak runs fleetsync for a while against a real kube-apiserver +
// etcd and a real 3-server Consul cluster, with continuous churn over a
// few hundred Services and faults injected at random times from a seed,
// while a checker that reads Kubernetes and Consul itself holds the
// invariants the whole time:
//
//	(a) an entry fleetsync does not own (planted by the soak: a look-alike
//	    node, a VM's instances of the same names, another cluster's marked
//	    instance, a tampered copy of one of fleetsync's entries) is never
//	    modified or deleted (its ModifyIndex never moves);
//	(b) an instance of a ready endpoint is never missing from Consul, an
//	    instance of no ready endpoint never left in it, and no endpoint
//	    registered twice, for longer than
//	    --bound after the last change or the heal of the faults that
//	    overlap it (the worst gap per fault type is reported);
//	(c) once churn stops and every fault is healed, Consul equals
//	    Kubernetes within --converge;
//	(d) it then stays so with zero transactions for --idle, and every
//	    transaction of the run is counted against the real changes made;
//	(e) no Service has a worker on two replicas in two samples in a row
//	    (their /debug/workers);
//	and no fleetsync process exits on its own.
//
// Every violation is printed with its time, fault and object, and makes the
// run fail (exit 1). The seed is printed first: --seed replays the same
// fault and churn schedule. Output: one line per figure, out/soak/result.json
// and out/soak/timeline.png.
//
//	go run ./test/soak                 # 10 minutes
//	go run ./test/soak --quick         # 2 minutes
//	go run ./test/soak --duration 30m --seed 42
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

type options struct {
	duration    time.Duration
	quick       bool
	seed        uint64
	services    int
	servicesB   int
	replicas    int
	shards      int
	servers     int
	bound       time.Duration
	converge    time.Duration
	idle        time.Duration
	sample      time.Duration
	churnEvery  time.Duration
	gapMin      time.Duration
	gapMax      time.Duration
	holdMin     time.Duration
	holdMax     time.Duration
	snapEvery   time.Duration
	snapshotAge time.Duration
	faults      []string
	tags        []string
	out         string
	logLevel    string
}

func defaults() options {
	return options{duration: 10 * time.Minute, services: 300, servicesB: 40, replicas: 2, shards: 4, servers: 3,
		bound: 30 * time.Second, converge: 60 * time.Second, idle: 15 * time.Second, sample: 500 * time.Millisecond,
		churnEvery: 200 * time.Millisecond, gapMin: 5 * time.Second, gapMax: 25 * time.Second,
		holdMin: 2 * time.Second, holdMax: 10 * time.Second, snapEvery: 15 * time.Second, snapshotAge: 20 * time.Second,
		faults: allFaults(), out: "out/soak", logLevel: "debug"}
}

// quickly is o as --quick makes it: 2 minutes, smaller, faults closer.
func (o options) quickly() options {
	o.duration, o.services, o.servicesB = 2*time.Minute, 200, 30
	o.gapMin, o.gapMax, o.holdMin, o.holdMax = 2*time.Second, 8*time.Second, 2*time.Second, 6*time.Second
	o.snapEvery, o.snapshotAge = 8*time.Second, 10*time.Second
	return o
}

func parse(args []string) (options, error) {
	o := defaults()
	for _, a := range args {
		if a == "--quick" || a == "-quick" || a == "--quick=true" || a == "-quick=true" {
			o = o.quickly() // then any flag given overrides
		}
	}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	var faults, tags string
	var seed int64
	fs.DurationVar(&o.duration, "duration", o.duration, "how long churn and faults run")
	fs.BoolVar(&o.quick, "quick", false, "2 minutes, 200 + 30 Services, faults closer together (the CI run)")
	fs.Int64Var(&seed, "seed", 0, "seed of the churn and fault schedule (0: from the clock; printed)")
	fs.IntVar(&o.services, "services", o.services, "Services of cluster alpha")
	fs.IntVar(&o.servicesB, "services-beta", o.servicesB, "Services of cluster beta, a second cluster id sharing the Consul (same names as alpha's first ones; 0: no beta)")
	fs.IntVar(&o.replicas, "replicas", o.replicas, "fleetsync replicas of cluster alpha")
	fs.IntVar(&o.shards, "shards", o.shards, "alpha's --shards")
	fs.IntVar(&o.servers, "consul-servers", o.servers, "Consul servers")
	fs.DurationVar(&o.bound, "bound", o.bound, "an instance may be missing (or stale) at most this long after its change or the heal of the faults overlapping it")
	fs.DurationVar(&o.converge, "converge", o.converge, "after the last fault, Consul must equal Kubernetes within this")
	fs.DurationVar(&o.idle, "idle", o.idle, "then no transaction at all for this long")
	fs.StringVar(&faults, "faults", strings.Join(o.faults, ","), "fault kinds to inject (comma-separated; '' for none)")
	fs.StringVar(&tags, "tags", "", "Go build tags of the fleetsync under test (the checker's own test builds a broken one)")
	fs.StringVar(&o.out, "out", o.out, "directory for result.json and timeline.png")
	fs.StringVar(&o.logLevel, "log-level", o.logLevel, "the daemons' --log-level (their logs are kept in --out; trace names every instance each flush writes)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.seed = uint64(seed)
	if seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	o.faults = nil
	known := allFaults()
	for _, f := range strings.Split(faults, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		found := false
		for _, k := range known {
			found = found || k == f
		}
		if !found {
			return o, fmt.Errorf("--faults: unknown fault %q (known: %s)", f, strings.Join(known, ", "))
		}
		o.faults = append(o.faults, f)
	}
	if tags != "" {
		o.tags = strings.Split(tags, ",")
	}
	if o.replicas < 1 || o.services < 5 || o.servers < 1 {
		return o, fmt.Errorf("need at least 1 replica, 5 Services and 1 Consul server")
	}
	return o, nil
}

func main() {
	o, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: harness error:", err)
		os.Exit(2)
	}
	if len(res.Violations) > 0 {
		fmt.Printf("FAIL: %d violation(s); replay with --seed %d\n", len(res.Violations), res.Seed)
		os.Exit(1)
	}
	fmt.Println("PASS")
}
