package main

import (
	"context"
	"fmt"
	"math"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

const (
	tok8sRepNS     = "tok8s-rep"    // where the replicas mirror
	tok8sRepLeases = "tok8s-leases" // their shard Leases
	tok8sRepID     = "bench-rep"    // their cluster id: the single daemon's objects are not theirs
)

// tok8sReplicas mirrors n services x m instances with several replicas of
// one cluster sharing them through --shards, default flags otherwise: the
// time to the full mirror, and per replica its shards, workers, blocking
// and polling health queries and peak RSS. Services beyond those already
// in Consul are registered first.
func (b *bench) tok8sReplicas(registered int) error {
	n, m, k, shards := b.opts.tok8sReplicaServices, b.opts.tok8sInstances, b.opts.replicas, b.opts.replicaShards
	if n <= 0 {
		return nil
	}
	b.stopDaemon()
	if n > registered {
		var ops consulapi.TxnOps
		for i := registered; i < n; i++ {
			for j := range m {
				ops = append(ops, vmOps(tok8sName(i), fmt.Sprintf("%s-%d", tok8sName(i), j), tok8sAddr(i, j), (i*m+j)%tok8sNodes, consulapi.HealthPassing)...)
			}
		}
		start := time.Now()
		if err := b.sendOps(ops); err != nil {
			return err
		}
		b.logf("registered %d more services x %d instances in Consul in %s", n-registered, m, since(start))
	}
	for _, ns := range []string{tok8sRepNS, tok8sRepLeases} {
		if err := fixture.Namespace(b.ctx, b.kc, ns); err != nil {
			return err
		}
	}
	w, err := startSliceWatch(b.ctx, b.kc, tok8sRepNS)
	if err != nil {
		return err
	}
	defer w.stop()
	set := &replicaSet{}
	defer set.stop()
	start := time.Now()
	for i := range k {
		d, err := fixture.SpawnDaemon(b.ctx, fixture.DaemonConfig{
			ClusterID: tok8sRepID, Kubeconfig: b.kube.KubeconfigPath, ConsulAddr: b.consul.Addr,
			Namespaces: []string{tok8sRepNS}, Name: fmt.Sprintf("tok8s-replica-%d", i),
			// All replicas reach Consul from 127.0.0.1, and Consul's
			// http_max_conns_per_client (200) counts per address: in a
			// cluster each pod has its own. The cap is split here.
			Args: []string{"--log-level=info", "--to-k8s", "--k8s-write-namespace=" + tok8sRepNS,
				fmt.Sprintf("--shards=%d", shards), "--lease-namespace=" + tok8sRepLeases, fmt.Sprintf("--replica-id=tok8s-%d", i),
				fmt.Sprintf("--to-k8s-max-watches=%d", 150/k)},
		})
		if err != nil {
			return err
		}
		set.daemons = append(set.daemons, d)
		b.stopped = append(b.stopped, d)
	}
	// Every instance, ready or not: the latency and flip steps left some
	// checks critical.
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Minute)
	defer cancel()
	if err := w.until(ctx, func(s map[string]*discoveryv1.EndpointSlice) bool {
		per := map[string]int{}
		for _, sl := range s {
			per[sl.Labels[discoveryv1.LabelServiceName]] += len(sl.Endpoints)
		}
		for i := range n {
			if per[tok8sName(i)] != m {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("%d services not mirrored by the replicas: %w", n, err)
	}
	took := time.Since(start)
	label := fmt.Sprintf("%s x %d, %d replicas --shards %d --to-k8s-max-watches=%d (one loopback address shares Consul's 200)", formatValue(float64(n)), m, k, shards, 150/k)
	b.res.add("to-k8s", label+": time to the full mirror", secs(took), "s",
		fmt.Sprintf("first spawn -> every slice complete; %.0f objects/s (each replica's own --to-k8s-qps 20)", float64(2*n)/took.Seconds()))
	for i, d := range set.daemons {
		blocking, polling, err := b.healthWatches(d)
		if err != nil {
			return err
		}
		sm, _, _, err := scrape(b.ctx, d.HTTP, "fleetsync_shard_held", "fleetsync_tok8s_workers")
		if err != nil {
			return err
		}
		_, hwm, err := memStatus(d.Pid())
		if err != nil {
			return err
		}
		b.res.add("to-k8s", fmt.Sprintf("%s: replica %d, health queries blocking / polling", label, i), blocking, "queries",
			fmt.Sprintf("%.0f polling; %.0f shards, %.0f workers", polling, sm["fleetsync_shard_held"], sm["fleetsync_tok8s_workers"]))
		b.res.add("to-k8s", fmt.Sprintf("%s: replica %d, peak RSS", label, i), math.Round(hwm/mib*10)/10, "MiB", "VmHWM, through the mirror")
	}
	return nil
}
