package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/worker"
)

const (
	rolloutBatch    = 25
	rolloutEvery    = 500 * time.Millisecond
	rolloutPerSlice = 100 // endpoints per EndpointSlice, as the EndpointSlice controller cuts them
)

// rolloutWindows are compared side by side, as the per-Service window
// annotation of three Services the same daemon syncs.
var rolloutWindows = []time.Duration{0, time.Second, 5 * time.Second}

func rolloutName(w time.Duration) string { return fmt.Sprintf("roll-w%s", w) }

// rollout replaces every endpoint of one Service, 25 every 500 ms, once for
// each window, and counts Consul's Raft applies.
func (b *bench) rollout() error {
	n := b.opts.rolloutEndpoints
	fmt.Printf("\n== rollout: one Service of %d endpoints replaced %d at a time every %s (new ready, old terminating, then gone); W=0, W=1s, W=5s\n", n, rolloutBatch, rolloutEvery)
	if err := b.ensureFleet(); err != nil {
		return err
	}
	if err := fixture.Namespace(b.ctx, b.kc, rolloutNS); err != nil {
		return err
	}
	applies := map[time.Duration]float64{}
	for i, w := range rolloutWindows {
		a, err := b.rolloutOne(w, 251+i, n)
		if err != nil {
			return fmt.Errorf("window %s: %w", w, err)
		}
		applies[w] = a
	}
	a0, a1, a5 := applies[0], applies[time.Second], applies[5*time.Second]
	b.res.add("rollout", "ratio of Raft applies, W=0 / W=1s", math.Round(a0/a1*100)/100, "x", "")
	b.res.add("rollout", "ratio of Raft applies, W=0 / W=5s", math.Round(a0/a5*100)/100, "x", "")
	// Remove the three Services: their instances leave Consul.
	for _, w := range rolloutWindows {
		if err := deleteService(b.ctx, b.kc, rolloutNS, rolloutName(w)); err != nil {
			return err
		}
	}
	for _, w := range rolloutWindows {
		if _, err := b.waitServiceAddrs(rolloutName(w), nil, 2*time.Minute); err != nil {
			return err
		}
	}
	_, err := b.quietApplies(2 * time.Second)
	return err
}

// rolloutOne creates Service roll-w<W> with n ready endpoints (EndpointSlices
// of 100), waits until they are in Consul, then rolls them over like a
// Deployment with maxSurge 25 and maxUnavailable 0: every 500 ms one slice
// write in which 25 new pods appear ready, the 25 old pods they replace start
// terminating (serving, not ready: a warning check by default), and the
// previous batch's terminating pods are gone. It returns the Raft applies the
// rollout cost.
func (b *bench) rolloutOne(w time.Duration, base, n int) (float64, error) {
	name := rolloutName(w)
	svc := benchService(rolloutNS, name, map[string]string{worker.AnnotationWindow: w.String()})
	if _, err := b.kc.CoreV1().Services(rolloutNS).Create(b.ctx, svc, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	old, fresh := fixture.IPs(base, 0, n), fixture.IPs(base, n, n)
	batches := n / rolloutBatch
	nSlices := (n + rolloutPerSlice - 1) / rolloutPerSlice
	// content is slice j after tick k: batches before k replaced, batch k
	// new + old terminating, later batches old (k = -1: before the rollout).
	content := func(j, k int) []fixture.EP {
		var eps []fixture.EP
		for p := j * rolloutPerSlice; p < min((j+1)*rolloutPerSlice, n); p++ {
			switch batch := p / rolloutBatch; {
			case batch < k:
				eps = append(eps, fresh[p])
			case batch == k:
				t := old[p]
				t.Terminating = true
				eps = append(eps, fresh[p], t)
			default:
				eps = append(eps, old[p])
			}
		}
		return eps
	}
	slices := make([]*sliceState, nSlices)
	for j := range slices {
		s := fixture.Slice(rolloutNS, name, fmt.Sprintf("%s-%d", name, j), discoveryv1.AddressTypeIPv4, httpPorts, content(j, -1))
		obj, err := b.kc.DiscoveryV1().EndpointSlices(rolloutNS).Create(b.ctx, s, metav1.CreateOptions{})
		if err != nil {
			return 0, err
		}
		slices[j] = &sliceState{obj: obj}
	}
	if _, err := b.waitServiceAddrs(name, ips(old), 2*time.Minute); err != nil {
		return 0, err
	}
	base0, err := b.quietApplies(max(2*time.Second, w+1500*time.Millisecond))
	if err != nil {
		return 0, err
	}
	m0, err := b.fleetCounters()
	if err != nil {
		return 0, err
	}

	start := time.Now()
	smp := b.sample(100*time.Millisecond, start, base0)
	tick := time.NewTicker(rolloutEvery)
	defer tick.Stop()
	writes := 0
	for k := 0; k <= batches; k++ {
		if k > 0 {
			select {
			case <-b.ctx.Done():
				smp.finish()
				return 0, b.ctx.Err()
			case <-tick.C:
			}
		}
		var touched []int
		if k < batches {
			touched = append(touched, k*rolloutBatch/rolloutPerSlice)
		}
		if j := (k - 1) * rolloutBatch / rolloutPerSlice; k > 0 && (len(touched) == 0 || touched[0] != j) {
			touched = append(touched, j)
		}
		for _, j := range touched {
			if err := setEndpoints(b.ctx, b.kc, slices[j], content(j, k)); err != nil {
				smp.finish()
				return 0, err
			}
			writes++
		}
	}
	lastWrite := time.Now()
	final, err := b.waitServiceAddrs(name, ips(fresh), 2*time.Minute)
	if err != nil {
		smp.finish()
		return 0, err
	}
	// Later windows must not write more: wait for a quiet spell longer
	// than the window.
	after, err := b.quietApplies(w + 2*time.Second)
	pts := smp.finish()
	if err != nil {
		return 0, err
	}
	m1, err := b.fleetCounters()
	if err != nil {
		return 0, err
	}
	pts = append(pts, Point{T: time.Since(start).Seconds(), V: after - base0})
	b.res.Series["rollout_"+w.String()] = pts
	used := after - base0
	label := fmt.Sprintf("W=%s", w)
	d := func(k string) float64 { return m1[k] - m0[k] }
	b.res.add("rollout", label+": Raft applies for the rollout", used, "applies", fmt.Sprintf("%d slice writes; fleetsync: %.0f flushes, %.0f transactions",
		writes, d("fleetsync_fleet_flushes_total"), d("fleetsync_consul_txn_duration_seconds_count")))
	b.res.add("rollout", label+": operations sent to Consul", d("fleetsync_consul_txn_ops_total"), "ops", fmt.Sprintf("%.0f instance writes (register, update, deregister), at most 128 ops per transaction", d("fleetsync_fleet_instance_writes_total")))
	b.res.add("rollout", label+": final state in Consul after the last write", secs(final.Sub(lastWrite)), "s", fmt.Sprintf("rollout itself took %s", lastWrite.Sub(start).Round(time.Millisecond)))
	return used, nil
}

// fleetCounters scrapes the daemon's fleet-wide write counters.
func (b *bench) fleetCounters() (map[string]float64, error) {
	m, _, _, err := scrape(b.ctx, b.daemon.HTTP, "fleetsync_fleet_flushes_total", "fleetsync_consul_txn_ops_total",
		"fleetsync_consul_txn_duration_seconds_count", "fleetsync_fleet_instance_writes_total")
	return m, err
}

func ips(eps []fixture.EP) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.IP
	}
	sort.Strings(out)
	return out
}

// sampler records Consul's Raft apply count (minus base) at a fixed period.
type sampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	pts    []Point
}

func (b *bench) sample(every time.Duration, start time.Time, base float64) *sampler {
	ctx, cancel := context.WithCancel(b.ctx)
	s := &sampler{cancel: cancel, done: make(chan struct{})}
	go func() { // s.pts is read only after done is closed
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if v, err := b.applies(); err == nil {
				s.pts = append(s.pts, Point{T: time.Since(start).Seconds(), V: v - base})
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// finish stops the sampler and returns its points.
func (s *sampler) finish() []Point {
	s.cancel()
	<-s.done
	return s.pts
}
