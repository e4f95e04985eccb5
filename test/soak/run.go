package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// result is everything one run measured (result.json).
type result struct {
	Seed          uint64              `json:"seed"`
	DurationS     float64             `json:"duration_s"`
	Services      map[string]int      `json:"services"`
	Replicas      int                 `json:"replicas"`
	Shards        int                 `json:"shards"`
	ConsulServers int                 `json:"consul_servers"`
	BoundS        float64             `json:"bound_s"`
	ColdStartS    float64             `json:"cold_start_s"`
	Faults        map[string]int      `json:"faults"`
	FaultLog      []*faultRec         `json:"fault_log"`
	Gaps          map[string]*gapStat `json:"missing_by_fault"`
	StaleGaps     map[string]*gapStat `json:"stale_by_fault"`
	TimeToExactS  float64             `json:"time_to_exact_after_last_fault_s"`
	Changes       int                 `json:"changes"`
	KubeWrites    int                 `json:"kube_writes"`
	KubeFailed    int                 `json:"kube_writes_failed"`
	Txns          int64               `json:"txns"`
	TxnsPerChange float64             `json:"txns_per_change"`
	IdleTxns      int64               `json:"idle_txns"`
	IdleS         float64             `json:"idle_s"`
	Samples       int                 `json:"samples"`
	FailedReads   int                 `json:"failed_reads"`
	Violations    []violation         `json:"violations"`
	Races         []string            `json:"races,omitempty"`
	Timeline      []point             `json:"timeline"`
	Plot          string              `json:"plot,omitempty"`
}

// run is one soak: it returns an error only when the harness itself
// failed (a server that would not start); broken invariants are in
// result.Violations.
func run(ctx context.Context, o options, out io.Writer) (*result, error) {
	res := &result{Seed: o.seed, Replicas: o.replicas, Shards: o.shards, ConsulServers: o.servers, BoundS: o.bound.Seconds(),
		Services: map[string]int{}, Faults: map[string]int{}}
	fmt.Fprintf(out, "soak: seed %d (replay: the same flags and --seed %d), %s, %d+%d Services, %d replicas --shards %d, %d Consul servers\n",
		o.seed, o.seed, o.duration, o.services, o.servicesB, o.replicas, o.shards, o.servers)
	w := newWorld(ctx, o, out)
	defer w.stop()
	w.chk = newChecker(w, o.bound)
	rng := rand.New(rand.NewPCG(o.seed, 0))

	w.logf("starting etcd + kube-apiserver and %d Consul servers", o.servers)
	if err := w.startServers(); err != nil {
		return nil, err
	}
	if err := w.createServices(rng); err != nil {
		return nil, err
	}
	for _, c := range w.clusters {
		res.Services[c.id] = len(c.model.svcs)
	}
	if err := w.plantAtStart(ctx); err != nil {
		return nil, err
	}
	w.logf("starting fleetsync: %d replica(s) of alpha, beta: %d", o.replicas, len(w.clusters)-1)
	t0 := time.Now()
	if err := w.startDaemons(); err != nil {
		return nil, err
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		t := time.NewTicker(o.sample)
		defer t.Stop()
		for {
			w.chk.sample(sampleCtx)
			w.checkDaemons()
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() { stopSampling(); sampling.Wait() }()
	if err := w.waitExact(ctx, time.Time{}, 180*time.Second); err != nil {
		return nil, fmt.Errorf("cold start: %w", err)
	}
	res.ColdStartS = time.Since(t0).Seconds()
	w.logf("cold start: Consul equals Kubernetes %.1fs after the daemons started", res.ColdStartS)

	// Churn and faults.
	soakCtx, stopSoak := context.WithTimeout(ctx, o.duration)
	defer stopSoak()
	var g sync.WaitGroup
	errs := make(chan error, 16)
	g.Add(1)
	go func() { defer g.Done(); w.snapshots(soakCtx, o.snapEvery) }()
	g.Add(1)
	go func() {
		defer g.Done()
		crng := rand.New(rand.NewPCG(o.seed, 1))
		t := time.NewTicker(o.churnEvery)
		defer t.Stop()
		for {
			select {
			case <-soakCtx.Done():
				return
			case <-t.C:
			}
			c := w.clusters[0]
			if len(w.clusters) > 1 && crng.IntN(o.services+o.servicesB) >= o.services {
				c = w.clusters[1]
			}
			_, _ = c.model.step(soakCtx, crng)
		}
	}()
	for i, tr := range tracks {
		var kinds []string
		for _, k := range tr {
			for _, f := range o.faults {
				if f == k {
					kinds = append(kinds, k)
				}
			}
		}
		if len(kinds) == 0 {
			continue
		}
		g.Add(1)
		go func() {
			defer g.Done()
			frng := rand.New(rand.NewPCG(o.seed, uint64(10+i)))
			// Every kind once, in a random order, then at random.
			order := append([]string(nil), kinds...)
			frng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
			for n := 0; ; n++ {
				sleep(soakCtx, o.gapMin+time.Duration(frng.Int64N(int64(o.gapMax-o.gapMin)+1)))
				if soakCtx.Err() != nil {
					return
				}
				kind := kinds[frng.IntN(len(kinds))]
				if n < len(order) {
					kind = order[n]
				}
				err := w.fault(soakCtx, kind, frng)
				switch {
				case errors.Is(err, errNotYet):
					if n < len(order) {
						order = append(order, kind) // still every kind once
					}
				case err != nil:
					errs <- fmt.Errorf("fault %s: %w", kind, err)
					return
				}
			}
		}()
	}
	g.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	healed := time.Now()
	w.logf("churn and faults stopped; every fault healed")

	// (c) exact again within the bound, (d) then idle.
	if err := w.waitExact(ctx, healed, o.converge); err != nil {
		w.dumpGoroutines()
		w.chk.mu.Lock()
		w.chk.violate(time.Now(), "converge", "all", "catalog", "%v", err)
		w.chk.mu.Unlock()
	} else {
		// When the first exact sample begun after the heal ended (an
		// exact streak begun before the heal says nothing of the heal).
		res.TimeToExactS = time.Since(healed).Seconds()
		w.logf("exact %.1fs after the last fault healed", res.TimeToExactS)
		before, beforeBy := w.txns(), w.txnsBy()
		idleStart := time.Now()
		sleep(ctx, o.idle)
		res.IdleTxns, res.IdleS = w.txns()-before, time.Since(idleStart).Seconds()
		if res.IdleTxns != 0 {
			var by []string
			for id, n := range w.txnsBy() {
				if d := n - beforeBy[id]; d != 0 {
					by = append(by, fmt.Sprintf("%s %d", id, d))
				}
			}
			slices.Sort(by)
			w.chk.mu.Lock()
			w.chk.violate(time.Now(), "idle-writes", "none", "catalog", "%d transaction(s) in %.0fs with nothing changing (%s)", res.IdleTxns, res.IdleS, strings.Join(by, ", "))
			w.chk.mu.Unlock()
		}
		if ok, _ := w.chk.exact(); !ok {
			w.chk.mu.Lock()
			w.chk.violate(time.Now(), "converge", "none", "catalog", "not exact at the end of the idle period")
			w.chk.mu.Unlock()
		}
	}
	stopSampling()
	sampling.Wait()
	w.chk.finish()

	res.DurationS = time.Since(w.start).Seconds()
	for _, c := range w.clusters {
		ch, wr, fl := c.model.counts()
		res.Changes += ch
		res.KubeWrites += wr
		res.KubeFailed += fl
	}
	res.Txns = w.txns()
	if res.Changes > 0 {
		res.TxnsPerChange = float64(res.Txns) / float64(res.Changes)
	}
	w.chk.mu.Lock()
	res.FaultLog = w.chk.faults
	for _, f := range w.chk.faults {
		res.Faults[f.Kind]++
	}
	res.Gaps, res.StaleGaps = w.chk.gaps, w.chk.extraGaps
	res.Violations = append([]violation{}, w.chk.violations...)
	res.Timeline = w.chk.timeline
	res.Samples, res.FailedReads = w.chk.samples, w.chk.failedReads
	w.chk.mu.Unlock()
	w.stop()
	res.Races = w.races()
	for _, r := range res.Races {
		res.Violations = append(res.Violations, violation{Rule: "data-race", Object: "fleetsync", Detail: r})
	}
	if err := report(res, o, out); err != nil {
		return res, err
	}
	return res, nil
}

// waitExact waits until a sample that began reading after `after` finds
// Consul equal to Kubernetes.
func (w *world) waitExact(ctx context.Context, after time.Time, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if w.chk.exactAfter(after) {
			return nil
		}
		if time.Now().After(deadline) {
			r := w.chk.lastReading()
			miss, extra := 0, 0
			if r != nil {
				for k := range r.Desired {
					if len(r.Present[k]) == 0 {
						miss++
					}
				}
				for k := range r.Present {
					if !r.Desired[k] {
						extra++
					}
				}
			}
			return fmt.Errorf("consul not equal to kubernetes after %s (last sample: %d missing, %d stale)", timeout, miss, extra)
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// checkDaemons reports a fleetsync process that exited on its own (no
// fault was restarting it) and starts it again.
func (w *world) checkDaemons() {
	for _, r := range w.allReplicas() {
		d := r.daemon()
		if d == nil || r.busy.Load() || d.Running() {
			continue
		}
		w.chk.mu.Lock()
		w.chk.violate(time.Now(), "daemon-exited", "", "replica "+r.id, "fleetsync exited on its own:\n%s", d.LogTail(20))
		w.chk.mu.Unlock()
		r.busy.Store(true)
		go func() {
			defer r.busy.Store(false)
			if err := d.Restart(w.ctx, true); err == nil {
				_ = d.WaitReady(w.ctx, 120*time.Second)
			}
		}()
	}
}
