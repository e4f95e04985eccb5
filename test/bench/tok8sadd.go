package main

import (
	"context"
	"fmt"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// tok8sAddLatency registers one more instance (with a passing check) on a
// service per sample, a different service each time, and times the Consul
// write returning -> the informer seeing its endpoint; then deregisters it
// and times the endpoint leaving. Past --to-k8s-max-watches such a change
// is not in the change feed (its checks pass), so a polled service shows
// it at its next poll: the figures (of scenario sc) say how many of the
// services poll.
func (b *bench) tok8sAddLatency(sc string, w *sliceWatch, n, m int) error {
	samples := max(10, b.opts.latencySamples/5)
	var added, removed []float64
	for k := range samples {
		i := (k * 7919) % n
		name := tok8sName(i)
		id, addr := name+"-added", tok8sAddr(i, m)
		node := (i*m + m) % tok8sNodes
		timed := func(what string, ops consulapi.TxnOps, present bool) (float64, error) {
			if err := b.sendOps(ops); err != nil {
				return 0, err
			}
			written := time.Now()
			ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
			defer cancel()
			err := w.until(ctx, func(s map[string]*discoveryv1.EndpointSlice) bool {
				_, ready, _ := endpointsOf(s, name)
				r, ok := ready[addr]
				return ok == present && (!present || r)
			})
			if err != nil {
				return 0, fmt.Errorf("instance %s of %s %s: not in its slice after 30 s: %w", addr, name, what, err)
			}
			return ms(time.Since(written)), nil
		}
		lat, err := timed("added", vmOps(name, id, addr, node, consulapi.HealthPassing), true)
		if err != nil {
			return err
		}
		added = append(added, lat)
		// Past the worker's window, so the removal is a change of its own.
		if err := sleep(b.ctx, tok8sWindow+500*time.Millisecond); err != nil {
			return err
		}
		lat, err = timed("removed", consulapi.TxnOps{{Service: &consulapi.ServiceTxnOp{Verb: consulapi.ServiceDelete,
			Node: fmt.Sprintf("vm-node-%02d", node), Service: consulapi.AgentService{ID: id, Service: name}}}}, false)
		if err != nil {
			return err
		}
		removed = append(removed, lat)
	}
	blocking, polling, err := b.healthWatches(b.daemon)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("%d samples; Consul write returned -> the slice in an informer; %.0f services watched, %.0f polled (not in the change feed: their checks pass)",
		samples, blocking, polling)
	for _, r := range []struct {
		what string
		lat  []float64
	}{{"instance added", added}, {"instance removed", removed}} {
		s := sortedCopy(r.lat)
		b.res.add(sc, r.what+" -> EndpointSlice: p50", round2(percentile(s, 50)), "ms", note+"; target <= 20")
		b.res.add(sc, r.what+" -> EndpointSlice: p99", round2(percentile(s, 99)), "ms", note+"; target <= 200")
	}
	return nil
}
