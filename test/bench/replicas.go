package main

import (
	"fmt"
	"math"
	"time"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// The replicas scenario: one cluster on several replicas sharing the
// Services through shard Leases, cold-started into an empty Consul; then
// idle, then one replica killed with SIGKILL and its shards taken over.
const leaseNS = "bench-leases"

// replicaSet is the scenario's daemons.
type replicaSet struct {
	daemons []*fixture.Daemon
}

func (r *replicaSet) stop() {
	for _, d := range r.daemons {
		if d.Running() {
			report("fleetsync replica", d.Stop())
		}
	}
}

func (b *bench) replicas() error {
	n, e, k, shards := b.opts.replicaServices, b.opts.endpoints, b.opts.replicas, b.opts.replicaShards
	fmt.Printf("\n== replicas: %d replicas --shards %d over %d Services x %d endpoints, cold start into an empty Consul, idle, one replica killed\n",
		k, shards, n, e)
	b.stopDaemon()
	if err := b.restartConsul(); err != nil {
		return err
	}
	if err := b.populate(n, e); err != nil {
		return err
	}
	if b.populated > n {
		b.logf("the namespace holds %d Services from earlier scenarios: the replicas sync them all", b.populated)
		n = b.populated
	}
	if err := fixture.Namespace(b.ctx, b.kc, leaseNS); err != nil {
		return err
	}
	label := fmt.Sprintf("%s x %d, %d replicas", formatValue(float64(n)), e, k)
	base, err := b.consulWrites()
	if err != nil {
		return err
	}
	reqBase, err := b.consulRequests()
	if err != nil {
		return err
	}
	servers := b.serverPids()
	cpuBase := cpuOf(servers)
	set := &replicaSet{}
	defer set.stop()
	start := time.Now()
	for i := range k {
		args := []string{"--log-level=info", fmt.Sprintf("--shards=%d", shards), "--lease-namespace=" + leaseNS,
			fmt.Sprintf("--replica-id=bench-%d", i)}
		if b.opts.consulNodes > 0 {
			args = append(args, fmt.Sprintf("--consul-nodes=%d", b.opts.consulNodes))
		}
		d, err := fixture.SpawnDaemon(b.ctx, fixture.DaemonConfig{
			ClusterID: clusterID, Kubeconfig: b.kube.KubeconfigPath, ConsulAddr: b.consul.Addr,
			Namespaces: []string{benchNS}, Name: fmt.Sprintf("replica-%d", i), Args: args,
		})
		if err != nil {
			return err
		}
		set.daemons = append(set.daemons, d)
		b.stopped = append(b.stopped, d) // its log directory goes at teardown
	}
	seen, err := b.waitNames(svcPrefix, n, pollEvery(n), 90*time.Minute)
	if err != nil {
		return err
	}
	if _, total, err := b.nodeState(svcPrefix); err != nil {
		return err
	} else if total != n*e {
		return fmt.Errorf("%s: %d of %d instances in Consul once every name was there", label, total, n*e)
	}
	toAll := seen.Sub(start)
	procs := append([]namedPid(nil), servers...)
	for i, d := range set.daemons {
		procs = append(procs, namedPid{fmt.Sprintf("replica-%d", i), d.Pid()})
	}
	cpu := cpuOf(procs)
	reqs, err := b.consulRequests()
	if err != nil {
		return err
	}
	reqs = reqs.minus(reqBase)
	if _, err := b.quietApplies(3 * time.Second); err != nil {
		return err
	}
	after, err := b.consulWrites()
	if err != nil {
		return err
	}
	w := after.minus(base)
	inst := float64(n * e)
	sc := "replicas"
	b.res.add(sc, label+": time to all "+formatValue(inst)+" instances in Consul", secs(toAll), "s", "first spawn -> last instance seen")
	b.res.add(sc, label+": instances per second", math.Round(inst/toAll.Seconds()), "instances/s", "")
	b.res.add(sc, label+": Raft applies used", w.total, "applies", w.breakdown())
	b.res.add(sc, label+": Consul FSM time per transaction", math.Round(w.txnMillis/w.txn*100)/100, "ms", "mean of consul_fsm_txn")
	b.res.add(sc, label+": CPU from first spawn to all seen, all processes", cpuSum(cpu, cpuBase), "s CPU", cpuNote(cpu, cpuBase, toAll))
	b.res.add(sc, label+": Consul HTTP requests from first spawn to all seen", reqs.total(), "requests",
		"by path, with Consul's time in the handlers (consul_api_http, blocking queries' waits included; the bench's own watch included): "+reqs.String())
	for i, d := range set.daemons {
		m, _, _, err := scrape(b.ctx, d.HTTP, "fleetsync_shard_held", "fleetsync_fleet_workers")
		if err != nil {
			return err
		}
		_, hwm, err := memStatus(d.Pid())
		if err != nil {
			return err
		}
		b.res.add(sc, fmt.Sprintf("%s: replica %d, shards held / workers", label, i), m["fleetsync_shard_held"], "shards",
			fmt.Sprintf("%.0f workers", m["fleetsync_fleet_workers"]))
		b.res.add(sc, fmt.Sprintf("%s: replica %d, peak RSS", label, i), math.Round(hwm/mib*10)/10, "MiB", "VmHWM, cold start")
	}

	// Idle: every replica's CPU and memory, and Consul's applies.
	cpu0 := make([]float64, len(set.daemons))
	for i, d := range set.daemons {
		if cpu0[i], err = cpuSeconds(d.Pid()); err != nil {
			return err
		}
	}
	idle, err := b.idleWindow(set.daemons[0].Pid(), b.opts.idle)
	if err != nil {
		return err
	}
	b.res.add(sc, label+": Raft applies while idle", idle.applies, "applies", fmt.Sprintf("over %s, all replicas", idle.elapsed.Round(time.Second)))
	for i, d := range set.daemons {
		cpu1, err := cpuSeconds(d.Pid())
		if err != nil {
			return err
		}
		rss, _, err := memStatus(d.Pid())
		if err != nil {
			return err
		}
		m, _, _, err := scrape(b.ctx, d.HTTP, "fleetsync_fleet_workers")
		if err != nil {
			return err
		}
		workers := m["fleetsync_fleet_workers"]
		b.res.add(sc, fmt.Sprintf("%s: replica %d, RSS idle", label, i), math.Round(rss/mib*10)/10, "MiB",
			fmt.Sprintf("%.1f KiB per Service held (%.0f)", rss/1024/math.Max(workers, 1), workers))
		b.res.add(sc, fmt.Sprintf("%s: replica %d, CPU idle", label, i), math.Round((cpu1-cpu0[i])/idle.elapsed.Seconds()*100*1000)/1000, "% of a core",
			"right after the cold start; each worker's first anti-entropy pass, which reads its instances, comes 0.5 to 1.5 --resync-period after its first sync")
	}

	// One replica killed: the others take its shards over; nothing
	// changed in Kubernetes, so nothing is written.
	if len(set.daemons) > 1 {
		if err := b.killReplica(set, label, shards); err != nil {
			return err
		}
	}
	set.stop()
	return b.limitOfReplicas(label, n, e, toAll)
}

// killReplica kills the last replica with SIGKILL and measures until the
// others hold every shard and Consul is quiet.
func (b *bench) killReplica(set *replicaSet, label string, shards int) error {
	sc := "replicas"
	base, err := b.consulWrites()
	if err != nil {
		return err
	}
	victim := set.daemons[len(set.daemons)-1]
	m, _, _, err := scrape(b.ctx, victim.HTTP, "fleetsync_shard_held")
	if err != nil {
		return err
	}
	lost := m["fleetsync_shard_held"]
	killed := time.Now()
	if err := victim.Kill(); err != nil {
		return err
	}
	survivors := set.daemons[:len(set.daemons)-1]
	deadline := killed.Add(5 * time.Minute)
	for {
		held := 0.0
		for _, d := range survivors {
			m, _, _, err := scrape(b.ctx, d.HTTP, "fleetsync_shard_held")
			if err != nil {
				return err
			}
			held += m["fleetsync_shard_held"]
		}
		if int(held) == shards {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the survivors hold %.0f of %d shards 5 minutes after the kill", label, held, shards)
		}
		if err := sleep(b.ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	takeover := time.Since(killed)
	// Ready again: every survivor's workers started over the owned state.
	w, err := b.writesOnceReady(base, survivors...)
	if err != nil {
		return err
	}
	_, total, err := b.nodeState(svcPrefix)
	if err != nil {
		return err
	}
	b.res.add(sc, label+": kill -9 of one replica, its shards held by the others after", secs(takeover), "s",
		fmt.Sprintf("%.0f shards moved; --lease-duration 15s (default)", lost))
	b.res.add(sc, label+": kill -9 of one replica, catalog writes", w.txn, "transactions", "target 0: nothing changed in Kubernetes")
	b.res.add(sc, label+": kill -9 of one replica, instances in Consul after", float64(total), "instances", "")
	return nil
}

// limitOfReplicas measures Consul's limit for the instances the replicas
// wrote, as limitAfter does for one daemon.
func (b *bench) limitOfReplicas(label string, n, e int, toAll time.Duration) error {
	s, err := b.snapshotOf(label, svcPrefix, coldResult{services: n, endpoints: e, toAll: toAll})
	if err != nil {
		return err
	}
	b.logf("limit: %s, the same %d instances on the same %d nodes into a fresh Consul", label, s.instances, len(s.nodes))
	return b.limitOf(s)
}
