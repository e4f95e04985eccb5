package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// tok8sFlips flips one instance's check 501 times as fast as Consul takes
// them (4 writers), ending critical, and counts the writes of the
// service's slices until the informer shows the end state and a window
// has passed.
func (b *bench) tok8sFlips(w *sliceWatch) error {
	const flips = 501
	i, m := 0, b.opts.tok8sInstances
	name, addr := tok8sName(i), tok8sAddr(i, 1)
	if err := sleep(b.ctx, 2*tok8sWindow); err != nil {
		return err
	}
	_, before := w.counts(name)
	var k atomic.Int64
	start := time.Now()
	err := parallelN(b.ctx, 4, 0, flips-1, func(ctx context.Context, _ int) error {
		status := consulapi.HealthPassing
		if k.Add(1)%2 == 1 {
			status = consulapi.HealthCritical
		}
		return b.setCheck(name, i, 1, m, status)
	})
	if err == nil {
		err = b.setCheck(name, i, 1, m, consulapi.HealthCritical)
	}
	if err != nil {
		return err
	}
	took := time.Since(start)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := w.until(ctx, func(s map[string]*discoveryv1.EndpointSlice) bool {
		_, ready, _ := endpointsOf(s, name)
		r, ok := ready[addr]
		return ok && !r
	}); err != nil {
		return fmt.Errorf("end state of %d flips not in the slice: %w", flips, err)
	}
	if err := sleep(b.ctx, 3*tok8sWindow); err != nil { // any write still pending lands within a window
		return err
	}
	_, after := w.counts(name)
	b.res.add("to-k8s", "flips of one check -> writes of its slices", float64(after-before), "writes",
		fmt.Sprintf("%d flips in %s (as fast as Consul took them, 4 writers); target <= 3", flips, took.Round(time.Millisecond)))
	return nil
}

// tok8sLarge mirrors one service of many instances, then flips one
// instance's check and counts the slice writes.
func (b *bench) tok8sLarge(w *sliceWatch) error {
	big := b.opts.tok8sLarge
	var ops consulapi.TxnOps
	for j := range big {
		ops = append(ops, vmOps(tok8sBig, fmt.Sprintf("%s-%d", tok8sBig, j), tok8sBigAddr(j), j%tok8sNodes, consulapi.HealthPassing)...)
	}
	start := time.Now()
	if err := b.sendOps(ops); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Minute)
	defer cancel()
	var objects int
	if err := w.until(ctx, func(s map[string]*discoveryv1.EndpointSlice) bool {
		var n int
		n, _, objects = endpointsOf(s, tok8sBig)
		return n == big
	}); err != nil {
		return fmt.Errorf("%d instances of %s not mirrored: %w", big, tok8sBig, err)
	}
	b.res.add("to-k8s", "one service of many instances: slices", float64(objects), "slices",
		fmt.Sprintf("%d instances, mirrored %s after the last of them was registered", big, since(start)))
	if err := sleep(b.ctx, 2*tok8sWindow); err != nil {
		return err
	}
	_, before := w.counts(tok8sBig)
	j := big / 2
	if _, _, _, err := b.consul.Client.Txn().Txn(vmOps(tok8sBig, fmt.Sprintf("%s-%d", tok8sBig, j), tok8sBigAddr(j), j%tok8sNodes, consulapi.HealthCritical)[1:],
		(&consulapi.QueryOptions{}).WithContext(b.ctx)); err != nil {
		return err
	}
	written := time.Now()
	if err := w.until(ctx, func(s map[string]*discoveryv1.EndpointSlice) bool {
		_, ready, _ := endpointsOf(s, tok8sBig)
		r, ok := ready[tok8sBigAddr(j)]
		return ok && !r
	}); err != nil {
		return err
	}
	lat := time.Since(written)
	if err := sleep(b.ctx, 2*tok8sWindow); err != nil {
		return err
	}
	_, after := w.counts(tok8sBig)
	b.res.add("to-k8s", "one service of many instances: one check flip -> slice writes", float64(after-before), "writes",
		fmt.Sprintf("seen in the informer after %s; target 1", lat.Round(time.Millisecond)))
	return nil
}
