package main

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// churnWriters is how many goroutines write the churn's slice updates; each
// owns every churnWriters-th Service, so one Service's writes never overlap.
const churnWriters = 50

// churn changes C Services once per second each for the churn duration,
// against a daemon with a write budget, then measures how long each
// Service's final state takes to reach Consul.
func (b *bench) churn() error {
	c, dur, budget := b.opts.churnServices, b.opts.churnFor, b.opts.churnBudget
	rounds := int(dur / time.Second)
	fmt.Printf("\n== churn: %d Services each changing once per second for %s, --consul-max-writes-per-second=%g\n", c, dur, budget)
	if err := b.ensureFleet(); err != nil {
		return err
	}
	// The same cluster's daemon again, now with a write budget; a restart
	// with nothing changed costs no writes.
	b.stopDaemon()
	d, err := b.startDaemon("fleetsync-churn", []string{benchNS, rolloutNS}, fmt.Sprintf("--consul-max-writes-per-second=%g", budget))
	if err != nil {
		return err
	}
	if _, err := waitReady(b.ctx, d, 5*time.Minute); err != nil {
		return err
	}
	b.converged, b.convergedAt = true, time.Now()
	b.logf("daemon: fleetsync %s", daemonArgs(d))
	base, err := b.quietApplies(3 * time.Second)
	if err != nil {
		return err
	}
	w0, err := b.consulWrites()
	if err != nil {
		return err
	}

	start := time.Now().Add(time.Second).Truncate(time.Second)
	if err := sleep(b.ctx, time.Until(start)); err != nil {
		return err
	}
	smp := b.sample(time.Second, start, base)
	var (
		wrote    atomic.Int64
		lateMax  atomic.Int64 // ns behind schedule, worst
		errOnce  sync.Once
		writeErr error
		wg       sync.WaitGroup
	)
	for g := range churnWriters {
		wg.Go(func() {
			for r := range rounds {
				for i := g; i < c; i += churnWriters {
					at := start.Add(time.Duration(r)*time.Second + time.Duration(i)*time.Second/time.Duration(c))
					if err := sleep(b.ctx, time.Until(at)); err != nil {
						return
					}
					for late := int64(time.Since(at)); ; {
						cur := lateMax.Load()
						if late <= cur || lateMax.CompareAndSwap(cur, late) {
							break
						}
					}
					st := b.slices[svcName(i)]
					st.offset++
					if err := setEndpoints(b.ctx, b.kc, st, st.endpoints()); err != nil {
						errOnce.Do(func() { writeErr = err })
						return
					}
					wrote.Add(1)
				}
			}
		})
	}
	wg.Wait()
	stopped := time.Now()
	if writeErr != nil {
		smp.finish()
		return writeErr
	}
	if err := b.ctx.Err(); err != nil {
		smp.finish()
		return err
	}
	churnSecs := stopped.Sub(start).Seconds()

	// Lag: when each Service's final state is first seen in Consul. The
	// whole node is read once a second (reading it more often loads Consul,
	// the bottleneck here, noticeably).
	want := make(map[string][]string, c)
	for i := range c {
		name := svcName(i)
		for _, ip := range ips(b.slices[name].endpoints()) {
			want[name] = append(want[name], ip+":80")
		}
	}
	var lags []float64
	for len(want) > 0 {
		state, _, err := b.nodeState(svcPrefix)
		if err != nil {
			smp.finish()
			return err
		}
		seen := time.Since(stopped).Seconds()
		for name, w := range want {
			if equalStrings(state[name], w) {
				lags = append(lags, seen)
				delete(want, name)
			}
		}
		if time.Since(stopped) > 5*time.Minute {
			smp.finish()
			return fmt.Errorf("%d Services not in their final state 5 minutes after the churn stopped", len(want))
		}
		if len(want) > 0 {
			if err := sleep(b.ctx, time.Second); err != nil {
				smp.finish()
				return err
			}
		}
	}
	drained := time.Now()
	after, err := b.quietApplies(3 * time.Second)
	pts := smp.finish()
	if err != nil {
		return err
	}
	b.res.Series["churn"] = pts
	b.res.Series["churn_stop"] = []Point{{T: churnSecs}}
	w1, err := b.consulWrites()
	if err != nil {
		return err
	}
	w := w1.minus(w0)

	// Rates over the 1 s sampling intervals.
	var rates []float64
	for i := 1; i < len(pts); i++ {
		dt := pts[i].T - pts[i-1].T
		if dt <= 0 {
			continue
		}
		r := (pts[i].V - pts[i-1].V) / dt
		rates = append(rates, r)
	}
	maxRate := 0.0
	for _, r := range rates {
		maxRate = max(maxRate, r)
	}
	var duringChurn float64
	for _, p := range pts {
		if p.T <= churnSecs {
			duringChurn = p.V
		}
	}
	total := after - base
	s := sortedCopy(lags)
	sc := "churn"
	b.res.add(sc, "Service changes written to the API server", float64(wrote.Load()), "changes", fmt.Sprintf("%.0f/s achieved of %d/s asked; worst writer %s behind schedule",
		float64(wrote.Load())/churnSecs, c, time.Duration(lateMax.Load()).Round(time.Millisecond)))
	b.res.add(sc, "Raft applies per second, max (1 s intervals)", math.Round(maxRate*10)/10, "applies/s", fmt.Sprintf("budget %g/s, burst 10", budget))
	b.res.add(sc, "Raft applies per second, mean during the churn", math.Round(duringChurn/churnSecs*10)/10, "applies/s", fmt.Sprintf("%.0f applies in %.1f s", duringChurn, churnSecs))
	b.res.add(sc, "Raft applies in all (churn + catch-up)", total, "applies", fmt.Sprintf("%.3f per change", total/float64(wrote.Load())))
	b.res.add(sc, "Consul FSM time per transaction", math.Round(w.txnMillis/w.txn*100)/100, "ms", "mean of consul_fsm_txn over the churn and catch-up; the FSM applies one at a time")
	b.res.add(sc, "final state in Consul after the churn stopped: p50", round2(percentile(s, 50)), "s", fmt.Sprintf("%d Services; Consul read once a second", len(s)))
	b.res.add(sc, "final state in Consul after the churn stopped: p90", round2(percentile(s, 90)), "s", "")
	b.res.add(sc, "final state in Consul after the churn stopped: max", round2(s[len(s)-1]), "s", fmt.Sprintf("all final %s after the churn", drained.Sub(stopped).Round(time.Millisecond)))
	return nil
}
