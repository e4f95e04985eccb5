package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// coldResult is one cold start: fleetsync started against a Consul holding
// nothing of its cluster, with every Service already in the API server.
type coldResult struct {
	services, endpoints int
	toAll               time.Duration      // spawn -> every instance in Consul
	toReady             time.Duration      // spawn -> /readyz 200
	writes              consulWrites       // Raft applies from spawn until quiet
	txns                float64            // transactions fleetsync says it committed
	conflicts, passes   float64            // CAS conflicts, anti-entropy passes (fleetsync's counters)
	losses              float64            // data-loss signals fleetsync raised
	peakRSS             float64            // VmHWM once converged
	cpu, cpuBase        map[string]float64 // CPU seconds by process at seen, and at spawn
	requests            consulRequests     // what Consul served from spawn to seen
}

// pollEvery is how often waitNames reads the catalog while n Services are
// written: each read makes Consul list every service name, so the limit's
// writes are watched the same way (limitOf).
func pollEvery(n int) time.Duration {
	switch {
	case n > 2000:
		// At 10,000 Services, reads every 250 ms made the limit's own
		// transactions 1.5x slower (FSM time 6.07 ms, unwatched 4.03 ms).
		return time.Second
	case n > 200:
		return 250 * time.Millisecond
	}
	return 100 * time.Millisecond
}

// coldRun starts a daemon over namespaces and waits until Consul holds n
// Services (names starting with prefix) of e instances each.
func (b *bench) coldRun(name string, namespaces []string, prefix string, n, e int) (coldResult, error) {
	r := coldResult{services: n, endpoints: e}
	if _, err := b.quietApplies(2 * time.Second); err != nil {
		return r, err
	}
	base, err := b.consulWrites()
	if err != nil {
		return r, err
	}
	servers := b.serverPids()
	r.cpuBase = cpuOf(servers)
	reqBase, err := b.consulRequests()
	if err != nil {
		return r, err
	}
	start := time.Now()
	d, err := b.startDaemon(name, namespaces)
	if err != nil {
		return r, err
	}
	profiled := b.cpuProfile(d, fmt.Sprintf("cold-%d", n), 20)
	defer profiled()
	consulProfiled := b.consulProfile(fmt.Sprintf("cold-%d", n), 20)
	defer consulProfiled()
	type readiness struct {
		at  time.Time
		err error
	}
	ready := make(chan readiness, 1)
	go func() {
		at, err := waitReady(b.ctx, d, 10*time.Minute)
		ready <- readiness{at, err}
	}()
	seen, err := b.waitNames(prefix, n, pollEvery(n), 90*time.Minute)
	if err != nil {
		return r, err
	}
	// Names appear with all their instances (one transaction each); check
	// the count once, and keep looking if it is short.
	for {
		_, total, err := b.nodeState(prefix)
		if err != nil {
			return r, err
		}
		if total == n*e {
			break
		}
		if time.Since(seen) > 2*time.Minute {
			return r, fmt.Errorf("%d of %d instances in Consul 2 minutes after every service name appeared", total, n*e)
		}
		if err := sleep(b.ctx, 200*time.Millisecond); err != nil {
			return r, err
		}
		seen = time.Now()
	}
	r.toAll = seen.Sub(start)
	r.cpu = cpuOf(append(servers, namedPid{"fleetsync", d.Pid()}))
	reqs, err := b.consulRequests()
	if err != nil {
		return r, err
	}
	r.requests = reqs.minus(reqBase)
	rd := <-ready
	if rd.err != nil {
		return r, rd.err
	}
	r.toReady = rd.at.Sub(start)
	if _, err := b.quietApplies(2 * time.Second); err != nil {
		return r, err
	}
	after, err := b.consulWrites()
	if err != nil {
		return r, err
	}
	r.writes = after.minus(base)
	if _, hwm, err := memStatus(d.Pid()); err == nil {
		r.peakRSS = hwm
	}
	m, _, _, err := scrape(b.ctx, d.HTTP, "fleetsync_consul_txn_duration_seconds_count", "fleetsync_fleet_cas_conflicts_total",
		"fleetsync_fleet_antientropy_passes_total", "fleetsync_consul_data_loss_detected_total")
	if err != nil {
		return r, err
	}
	r.txns = m["fleetsync_consul_txn_duration_seconds_count"]
	r.conflicts, r.passes = m["fleetsync_fleet_cas_conflicts_total"], m["fleetsync_fleet_antientropy_passes_total"]
	r.losses = m["fleetsync_consul_data_loss_detected_total"]
	b.converged, b.convergedAt = true, seen
	return r, nil
}

func (b *bench) recordCold(r coldResult, label string) {
	inst := float64(r.services * r.endpoints)
	sc := "cold-start"
	b.res.add(sc, fmt.Sprintf("%s: time to all %s instances in Consul", label, formatValue(inst)), secs(r.toAll), "s", "daemon spawn -> last instance seen")
	b.res.add(sc, label+": time to /readyz 200", secs(r.toReady), "s", "informers synced + owned state read")
	w := r.writes
	b.res.add(sc, label+": Raft applies used", w.total, "applies", fmt.Sprintf("%s; fleetsync counted %.0f transactions, %.0f CAS conflicts, %.0f anti-entropy passes, %.0f data-loss signals",
		w.breakdown(), r.txns, r.conflicts, r.passes, r.losses))
	b.res.add(sc, label+": Consul FSM time per transaction", math.Round(w.txnMillis/w.txn*100)/100, "ms", "mean of consul_fsm_txn; one transaction per Service here")
	b.res.add(sc, label+": instances per second", math.Round(inst/r.toAll.Seconds()), "instances/s", "")
	b.res.add(sc, label+": peak RSS of fleetsync", math.Round(r.peakRSS/mib*10)/10, "MiB", "VmHWM")
	b.res.add(sc, label+": CPU from spawn to all seen, all processes", cpuSum(r.cpu, r.cpuBase), "s CPU", cpuNote(r.cpu, r.cpuBase, r.toAll))
	b.res.add(sc, label+": Consul HTTP requests from spawn to all seen", r.requests.total(), "requests",
		"by path, with Consul's time in the handlers (consul_api_http, blocking queries' waits included; the bench's own watch included): "+r.requests.String())
}

// ensureFleet makes sure the main daemon runs over the Services of benchNS
// and has them all in Consul, starting it (a cold start, not recorded) if
// an earlier scenario did not.
func (b *bench) ensureFleet() error {
	if b.daemon != nil && b.converged {
		return nil
	}
	b.stopDaemon()
	if err := b.populate(b.opts.services, b.opts.endpoints); err != nil {
		return err
	}
	b.logf("starting fleetsync over %d Services", b.opts.services)
	r, err := b.coldRun("fleetsync", []string{benchNS, rolloutNS}, svcPrefix, b.opts.services, b.opts.endpoints)
	if err != nil {
		return err
	}
	b.logf("converged in %s", r.toAll.Round(time.Millisecond))
	return nil
}

// coldStart: first the size consul-k8s was measured at (200 x 5), then the
// benchmark's size, each into an empty Consul.
func (b *bench) coldStart() error {
	fmt.Println("\n== cold start: Services + EndpointSlices in the API server, fleetsync started against an empty Consul")
	if err := b.compareColdStart(); err != nil {
		return err
	}
	if err := b.populate(b.opts.services, b.opts.endpoints); err != nil {
		return err
	}
	r, err := b.coldRun("fleetsync", []string{benchNS, rolloutNS}, svcPrefix, b.opts.services, b.opts.endpoints)
	if err != nil {
		return err
	}
	b.logf("daemon: fleetsync %s", daemonArgs(b.daemon))
	label := fmt.Sprintf("%s x %d", formatValue(float64(r.services)), r.endpoints)
	b.recordCold(r, label)
	return b.limitAfter(label, svcPrefix, r, "fleetsync", benchNS, rolloutNS)
}

// compareColdStart times 200 Services x 5 endpoints (the 1,000 instances
// consul-k8s took 64.6 s for), then removes them and empties Consul.
func (b *bench) compareColdStart() error {
	const n, e = 200, 5
	if err := fixture.Namespace(b.ctx, b.kc, compareNS); err != nil {
		return err
	}
	name := func(i int) string { return fmt.Sprintf("cmp-%03d", i) }
	start := time.Now()
	if err := parallel(b.ctx, 0, n, func(ctx context.Context, i int) error {
		_, err := createService(ctx, b.kc, benchService(compareNS, name(i), nil), ipBase(i), 0, e)
		return err
	}); err != nil {
		return err
	}
	b.logf("created %d Services + slices (%d endpoints each) in %s", n, e, since(start))
	r, err := b.coldRun("fleetsync-compare", []string{compareNS}, "cmp-", n, e)
	if err != nil {
		return err
	}
	b.recordCold(r, "200 x 5")
	if err := b.limitAfter("200 x 5", "cmp-", r, ""); err != nil {
		return err
	}
	b.stopDaemon()
	if err := parallel(b.ctx, 0, n, func(ctx context.Context, i int) error {
		return deleteService(ctx, b.kc, compareNS, name(i))
	}); err != nil {
		return err
	}
	return b.restartConsul()
}

// idle: Raft applies and CPU while nothing changes.
func (b *bench) idle() error {
	fmt.Printf("\n== idle: nothing changes for %s\n", b.opts.idle)
	if err := b.ensureFleet(); err != nil {
		return err
	}
	label := fmt.Sprintf("%s x %d", formatValue(float64(b.opts.services)), b.opts.endpoints)
	if !b.opts.steady {
		if err := b.measureIdle(label+", after convergence", b.opts.idle); err != nil {
			return err
		}
	} else {
		// Each worker's first anti-entropy pass falls 0.5 to 1.5
		// --resync-period (5m, the default) after its first sync, and
		// reads all of its instances: measured 0.6 periods after the
		// fleet converged, where they come at their full rate (for a
		// cold start shorter than 0.9 periods).
		wait := time.Until(b.convergedAt.Add(resyncPeriod * 6 / 10))
		b.logf("waiting %s for the first anti-entropy passes (%s after the fleet converged)", wait.Round(time.Second), resyncPeriod*6/10)
		if err := sleep(b.ctx, wait); err != nil {
			return err
		}
		if err := b.measureIdle(label+", first passes", b.opts.idle); err != nil {
			return err
		}
		// Later passes read only when Consul's index of the name moved.
		// Steady state is when every worker made its first pass (1.5
		// periods after its first sync) and the second ones come at
		// their full rate: 1.6 periods after the fleet converged.
		wait = time.Until(b.convergedAt.Add(resyncPeriod * 16 / 10))
		b.logf("waiting %s for every worker's first anti-entropy pass (%s after the fleet converged)", wait.Round(time.Second), resyncPeriod*16/10)
		if err := sleep(b.ctx, wait); err != nil {
			return err
		}
		if err := b.measureIdle(label+", steady", b.opts.idle); err != nil {
			return err
		}
	}
	// With --pprof, what the idle CPU was spent on: a profile of another
	// idle stretch as long (not of the one measured, which it would add to).
	b.cpuProfile(b.daemon, "idle", int(b.opts.idle.Seconds()))()
	return nil
}

// resyncPeriod is the daemon's default --resync-period.
const resyncPeriod = 5 * time.Minute

func (b *bench) measureIdle(label string, d time.Duration) error {
	w, err := b.idleWindow(b.daemon.Pid(), d)
	if err != nil {
		return err
	}
	b.res.add("idle", label+": Raft applies while idle", w.applies, "applies", fmt.Sprintf("over %s", w.elapsed.Round(time.Second)))
	b.res.add("idle", label+": Raft applies per minute", math.Round(w.applies/w.elapsed.Minutes()*100)/100, "applies/min", "target 0")
	b.res.add("idle", label+": fleetsync CPU time", math.Round(w.cpu*100)/100, "s CPU", fmt.Sprintf("over %s, /proc/<pid>/stat", w.elapsed.Round(time.Second)))
	b.res.add("idle", label+": fleetsync CPU use", math.Round(w.cpu/w.elapsed.Seconds()*100*1000)/1000, "% of a core", "")
	return nil
}

// idleCost is what an idle window cost: Raft applies, CPU seconds of one
// process, and how long it lasted.
type idleCost struct {
	applies, cpu float64
	elapsed      time.Duration
}

// idleWindow waits for Consul's applies to settle, then measures the Raft
// applies and pid's CPU time over d.
func (b *bench) idleWindow(pid int, d time.Duration) (idleCost, error) {
	a0, err := b.quietApplies(2 * time.Second)
	if err != nil {
		return idleCost{}, err
	}
	cpu0, err := cpuSeconds(pid)
	if err != nil {
		return idleCost{}, err
	}
	t0 := time.Now()
	if err := sleep(b.ctx, d); err != nil {
		return idleCost{}, err
	}
	a1, err := b.applies()
	if err != nil {
		return idleCost{}, err
	}
	cpu1, err := cpuSeconds(pid)
	if err != nil {
		return idleCost{}, err
	}
	return idleCost{applies: a1 - a0, cpu: cpu1 - cpu0, elapsed: time.Since(t0)}, nil
}

// memPoint is the daemon's memory at one size.
type memPoint struct {
	services   int
	rss, heap  float64
	goroutines float64
}

func (b *bench) memorySmall() error {
	fmt.Println("\n== memory: RSS and Go heap of the converged, idle daemon")
	if err := b.ensureFleet(); err != nil {
		return err
	}
	return b.measureMemory(b.opts.services)
}

// measureMemory reads RSS from /proc first (before any scrape of /metrics
// can add to it), then the Go heap in use from /metrics (least of three
// scrapes: a scrape's own garbage may be counted).
func (b *bench) measureMemory(services int) error {
	pid := b.daemon.Pid()
	rss, _, err := memStatus(pid)
	if err != nil {
		return err
	}
	heap, gor, stacks, retained := math.Inf(1), 0.0, 0.0, 0.0
	var size int
	var took time.Duration
	var series float64
	for i := range 3 {
		if i > 0 {
			if err := sleep(b.ctx, time.Second); err != nil {
				return err
			}
		}
		m, n, d, err := scrape(b.ctx, b.daemon.HTTP, "go_memstats_heap_inuse_bytes", "go_goroutines",
			"go_memstats_stack_inuse_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes")
		if err != nil {
			return err
		}
		if i == 0 {
			size, took, series = n, d, m[seriesCount]
		}
		if m["go_memstats_heap_inuse_bytes"] < heap {
			heap, stacks = m["go_memstats_heap_inuse_bytes"], m["go_memstats_stack_inuse_bytes"]
			retained = m["go_memstats_heap_idle_bytes"] - m["go_memstats_heap_released_bytes"]
		}
		gor = m["go_goroutines"]
	}
	if b.opts.pprof {
		path := filepath.Join(b.opts.out, fmt.Sprintf("heap-%d.pb.gz", services))
		if err := saveURL(b.ctx, b.daemon.HTTP+"/debug/pprof/heap", path); err != nil {
			return err
		}
		b.logf("heap profile: %s (go tool pprof -sample_index=inuse_space -top %s)", path, path)
	}
	p := memPoint{services: services, rss: rss, heap: heap, goroutines: gor}
	b.mem = append(b.mem, p)
	label := fmt.Sprintf("%s x %d", formatValue(float64(services)), b.opts.endpoints)
	b.res.add("memory", label+": fleetsync RSS", math.Round(rss/mib*10)/10, "MiB", "VmRSS, target < 256 MiB idle at 10,000 x 10")
	b.res.add("memory", label+": Go heap in use", math.Round(heap/mib*10)/10, "MiB", "go_memstats_heap_inuse_bytes")
	b.res.add("memory", label+": goroutine stacks", math.Round(stacks/mib*10)/10, "MiB", fmt.Sprintf("%.0f goroutines", gor))
	b.res.add("memory", label+": free heap kept by the Go runtime", math.Round(retained/mib*10)/10, "MiB", "heap idle - released: counted in RSS, not in use")
	b.res.add("memory", label+": one /metrics scrape", math.Round(float64(size)/mib*100)/100, "MiB", fmt.Sprintf("took %s; %s", took.Round(time.Millisecond), b.perWorker()))
	b.res.add("memory", label+": series in one /metrics scrape", series, "series", b.perWorker())
	return nil
}

// memoryLarge: a second cold start at --memory-large Services into an empty
// Consul, idle, then memory; and the per-Service cost from the two points.
func (b *bench) memoryLarge() error {
	n := b.opts.memoryLarge
	if n <= b.opts.services {
		return nil
	}
	fmt.Printf("\n== memory at %s Services: a second cold start into an empty Consul\n", formatValue(float64(n)))
	b.stopDaemon()
	if err := b.restartConsul(); err != nil {
		return err
	}
	if err := b.populate(n, b.opts.endpoints); err != nil {
		return err
	}
	r, err := b.coldRun("fleetsync-large", []string{benchNS, rolloutNS}, svcPrefix, n, b.opts.endpoints)
	if err != nil {
		return err
	}
	label := fmt.Sprintf("%s x %d", formatValue(float64(n)), b.opts.endpoints)
	b.recordCold(r, label)
	if err := b.measureIdle(label, min(b.opts.idle, 30*time.Second)); err != nil {
		return err
	}
	if err := b.measureMemory(n); err != nil {
		return err
	}
	if err := b.limitAfter(label, svcPrefix, r, ""); err != nil {
		return err
	}
	if len(b.mem) < 2 {
		return nil
	}
	lo, hi := b.mem[0], b.mem[len(b.mem)-1]
	dn := float64(hi.services - lo.services)
	perRSS := (hi.rss - lo.rss) / dn
	perHeap := (hi.heap - lo.heap) / dn
	b.res.add("memory", fmt.Sprintf("per Service (x%d endpoints), RSS slope", b.opts.endpoints), math.Round(perRSS/1024*10)/10, "KiB", fmt.Sprintf("(RSS at %d - RSS at %d) / %d", hi.services, lo.services, int(dn)))
	b.res.add("memory", fmt.Sprintf("per Service (x%d endpoints), heap slope", b.opts.endpoints), math.Round(perHeap/1024*10)/10, "KiB", "same, Go heap in use")
	b.res.add("memory", "fixed RSS (intercept at 0 Services)", math.Round((lo.rss-perRSS*float64(lo.services))/mib*10)/10, "MiB", "")
	proj := hi.rss + perRSS*float64(10000-hi.services)
	b.res.add("memory", fmt.Sprintf("projected RSS at 10,000 Services x %d (linear)", b.opts.endpoints), math.Round(proj/mib), "MiB",
		"from the two points above; the DESIGN target is < 256 MiB at 10,000 x 10")
	return nil
}

// restart: fleetsync restarted (SIGTERM, start again) with nothing changed.
func (b *bench) restart() error {
	fmt.Println("\n== restart: SIGTERM and start again, nothing changed")
	if err := b.ensureFleet(); err != nil {
		return err
	}
	want := b.opts.services * b.opts.endpoints
	if _, err := b.quietApplies(2 * time.Second); err != nil {
		return err
	}
	// Consul can stay busy for a while after a cold start (a snapshot, a
	// compaction, the daemon's first anti-entropy passes): this waits it
	// out.
	if waited, ok := b.quietCPU(0.15, 30*time.Second); !ok {
		b.logf("the servers still use over 15 %% of a core after %s: the restart shares the cores with them", waited.Round(time.Second))
	} else if waited > 2*time.Second {
		b.logf("waited %s for the servers' CPU to settle", waited.Round(time.Second))
	}
	a0, err := b.consulWrites()
	if err != nil {
		return err
	}
	// Watch the instance count in Consul throughout: counted once before
	// the stop and again whenever Consul's catalog-wide indexes moved
	// (any write or delete moves one). Counting every 250 ms instead
	// would read all 100,000 instances of the 10,000 x 10 point
	// back-to-back, for 3 s of Consul's and the harness's CPU each, on the
	// 2 cores the restarting daemon needs: most of what was measured as
	// its restart before 2026-12-01 21:00.
	marks, err := b.catalogMarks()
	if err != nil {
		return err
	}
	_, counted, err := b.nodeState(svcPrefix)
	if err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(b.ctx)
	fewest := make(chan [2]int, 1)
	go func() {
		least, counts := counted, 1
		for watchCtx.Err() == nil {
			if m, err := b.catalogMarks(); err == nil && m != marks {
				if _, total, err := b.nodeState(svcPrefix); err == nil {
					marks = m // only once counted: a failed count is tried again
					least = min(least, total)
					counts++
				}
			}
			_ = sleep(watchCtx, 250*time.Millisecond)
		}
		fewest <- [2]int{least, counts}
	}()
	d := b.daemon
	t0 := time.Now()
	if err := d.Stop(); err != nil {
		stopWatch()
		return err
	}
	stopped := time.Now()
	servers := b.serverPids()
	cpu0 := cpuOf(servers)
	consulProfiled := b.consulProfile("restart", 5) // Consul serving the restart's read
	defer consulProfiled()
	if err := d.Restart(b.ctx, false); err != nil { // the old process is gone: only starts
		stopWatch()
		return err
	}
	spawned := time.Now()
	profiled := b.cpuProfile(d, "restart", 15)
	defer profiled()
	readyAt, err := waitReady(b.ctx, d, 5*time.Minute)
	if err != nil {
		stopWatch()
		return err
	}
	cpu1 := cpuOf(append(servers, namedPid{"fleetsync", d.Pid()}))
	rssReady, _, _ := memStatus(d.Pid())
	if b.opts.pprof {
		// What the process allocated from its start to ready (GC's
		// work grows with it): go tool pprof -sample_index=alloc_space.
		path := filepath.Join(b.opts.out, "allocs-restart.pb.gz")
		if err := saveURL(b.ctx, d.HTTP+"/debug/pprof/allocs", path); err == nil {
			b.logf("allocation profile from the start to ready: %s (go tool pprof -sample_index=alloc_space -top %s)", path, path)
		}
	}
	// A write caused by the restart would come at once or a window later.
	if err := sleep(b.ctx, 5*time.Second); err != nil {
		stopWatch()
		return err
	}
	_, hwm, _ := memStatus(d.Pid())
	stopWatch()
	watched := <-fewest
	least, counts := watched[0], watched[1]
	a1, err := b.consulWrites()
	if err != nil {
		return err
	}
	w := a1.minus(a0)
	m, _, _, err := scrape(b.ctx, d.HTTP, "fleetsync_fleet_instance_writes_total", "fleetsync_consul_txn_ops_total", "fleetsync_supervisor_owned_instances_at_bootstrap",
		"fleetsync_supervisor_bootstrap_read_duration_seconds", "fleetsync_supervisor_bootstrap_duration_seconds")
	if err != nil {
		return err
	}
	// Consul's own limit for the owned-state read, with the daemon idle.
	const readers = 4 // consul.nodeReaders
	// Three times: Consul's CPU for the same answers varies with its own
	// GC (its heap holds every instance), the least is the limit.
	consulOnly := b.serverPids()[:len(b.consul.Servers())]
	var limit time.Duration
	var bytes int64
	var limitCPUs []string
	limitCPU := 0.0
	for i := range 3 {
		c0 := cpuOf(consulOnly)
		took, n, err := b.readLimit(readers)
		if err != nil {
			return err
		}
		used := cpuSum(cpuOf(consulOnly), c0)
		limitCPUs = append(limitCPUs, fmt.Sprintf("%.2f s in %.2f s", used, took.Seconds()))
		if i == 0 || took < limit {
			limit, bytes, limitCPU = took, n, used
		}
	}
	read := m["fleetsync_supervisor_bootstrap_read_duration_seconds"]
	b.res.add("restart", "Raft applies caused by the restart", w.total, "applies", w.breakdown()+"; until 5 s after ready")
	b.res.add("restart", "catalog writes caused by the restart", w.txn, "transactions", "target 0")
	b.res.add("restart", "instances written by the new process", m["fleetsync_fleet_instance_writes_total"], "instances", "its own metric")
	b.res.add("restart", "time to /readyz 200 after start", secs(readyAt.Sub(spawned)), "s", "")
	b.res.add("restart", "CPU from start to ready, all processes", cpuSum(cpu1, cpu0), "s CPU", cpuNote(cpu1, cpu0, readyAt.Sub(spawned)))
	b.res.add("restart", "peak RSS of the new process", math.Round(hwm/mib*10)/10, "MiB", fmt.Sprintf("VmHWM until 5 s after ready; %.1f MiB at ready", rssReady/mib))
	b.res.add("restart", "owned-state read, from the supervisor's start", math.Round(read*1000)/1000, "s", "fleetsync_supervisor_bootstrap_read_duration_seconds (beside the informers' sync)")
	b.res.add("restart", "bootstrap, from the supervisor's start", math.Round(m["fleetsync_supervisor_bootstrap_duration_seconds"]*1000)/1000, "s", "fleetsync_supervisor_bootstrap_duration_seconds (read, informers synced, workers started)")
	b.res.add("restart", "Consul's read limit: the same reads, bare HTTP client", secs(limit), "s",
		fmt.Sprintf("every node's services and checks, %d nodes at a time, %.1f MiB of answers discarded, daemon idle; Consul's CPU %.2f s; the fastest of 3 reads (Consul's CPU: %s)", readers, float64(bytes)/(1<<20), limitCPU, strings.Join(limitCPUs, ", ")))
	if read > 0 {
		b.res.add("restart", "owned-state read / Consul's read limit", math.Round(read/limit.Seconds()*100)/100, "ratio", "1 = the read is as fast as Consul answers")
	}
	b.res.add("restart", "graceful shutdown (SIGTERM to exit)", secs(stopped.Sub(t0)), "s", "")
	b.res.add("restart", "fewest instances in Consul during the restart", float64(least), "instances",
		fmt.Sprintf("of %d; counted before the stop and whenever Consul's catalog-wide indexes (polled every 250 ms) moved: %d counts; any delete would also be a Raft apply", want, counts))
	b.res.add("restart", "owned instances found at bootstrap", m["fleetsync_supervisor_owned_instances_at_bootstrap"], "instances", "")
	return nil
}
