package main

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// latency times isolated changes: each sample changes a different Service
// (or one whose last change is older than the window), one at a time, and
// measures from the EndpointSlice Update returning to a Consul blocking query
// on that service returning the new instances.
func (b *bench) latency() error {
	n := b.opts.latencySamples
	fmt.Printf("\n== latency: %d isolated changes (one endpoint replaced), slice write returned -> seen in a Consul blocking query\n", n)
	if err := b.ensureFleet(); err != nil {
		return err
	}
	if _, err := b.quietApplies(2 * time.Second); err != nil {
		return err
	}
	const window = time.Second // the daemon's default
	lastChange := map[string]time.Time{}
	var lat, writes []float64
	for k := range n {
		name := svcName(k % b.opts.services)
		if t, ok := lastChange[name]; ok {
			if err := sleep(b.ctx, window+500*time.Millisecond-time.Since(t)); err != nil {
				return err
			}
		}
		st := b.slices[name]
		// Block from the current index, as a watcher of the service would.
		_, index, err := b.serviceAddrs(name, 0, 0)
		if err != nil {
			return err
		}
		st.offset++ // one endpoint leaves, a new one arrives
		eps := st.endpoints()
		want := make([]string, len(eps))
		for i, e := range eps {
			want[i] = e.IP
		}
		sort.Strings(want)
		t0 := time.Now()
		if err := setEndpoints(b.ctx, b.kc, st, eps); err != nil {
			return err
		}
		written := time.Now()
		lastChange[name] = written
		for {
			got, idx, err := b.serviceAddrs(name, index, 10*time.Second)
			if err != nil {
				return err
			}
			if equalStrings(got, want) {
				break
			}
			if idx < index {
				idx = 0
			}
			index = idx
			if time.Since(written) > 30*time.Second {
				return fmt.Errorf("change %d to %s not in Consul after 30 s", k, name)
			}
		}
		lat = append(lat, ms(time.Since(written)))
		writes = append(writes, ms(written.Sub(t0)))
		// A pause between samples, so that each change is alone in flight.
		if err := sleep(b.ctx, time.Duration(100+rand.IntN(50))*time.Millisecond); err != nil {
			return err
		}
	}
	b.res.Latencies = make([]float64, len(lat))
	for i, v := range lat {
		b.res.Latencies[i] = v / 1000
	}
	s := sortedCopy(lat)
	note := fmt.Sprintf("%d samples", len(s))
	b.res.add("latency", "isolated change -> Consul: p50", round2(percentile(s, 50)), "ms", note)
	b.res.add("latency", "isolated change -> Consul: p90", round2(percentile(s, 90)), "ms", note)
	b.res.add("latency", "isolated change -> Consul: p99", round2(percentile(s, 99)), "ms", note)
	b.res.add("latency", "isolated change -> Consul: max", round2(s[len(s)-1]), "ms", note)
	b.res.add("latency", "isolated change -> Consul: mean", round2(mean(s)), "ms", note)
	b.res.add("latency", "EndpointSlice Update call itself: p50", round2(percentile(sortedCopy(writes), 50)), "ms", "not included above")
	return nil
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
