package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestFailoverBetweenServers: fleetsync knows the three servers of one
// datacenter (--consul-address three times). The server it talks to is
// stopped, first a follower, then (that one back) the leader: each time a
// change made right after the stop lands within --consul-request-timeout
// through another server; every instance written before keeps its
// ModifyIndex (nothing written twice) and every change is there once.
func TestFailoverBetweenServers(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{Servers: 3, ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range own.Servers() {
				if p := s.Agent(); p != nil {
					t.Logf("consul %s log tail:\n%s", s.NodeName, p.LogTail(20))
				}
			}
		}
		_ = own.Stop()
	})
	leader, err := own.Leader(e.ctx)
	must(t, err)
	follower := (leader + 1) % 3
	other := (leader + 2) % 3
	// fleetsync talks to the follower first, then the leader, then the other.
	order := []int{follower, leader, other}
	const timeout = 5 * time.Second
	names, keys := svcSet(t, e, "fo", 4, 2, 200)
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Server(order[0]).Addr, Namespaces: []string{e.ns},
		Args: []string{"--consul-address=" + own.Server(order[1]).Addr, "--consul-address=" + own.Server(order[2]).Addr,
			"--consul-request-timeout=" + timeout.String(), "--window=0", "--consul-datacenter=dc1"}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(60))
		}
		d.CloseT(t)
	})
	// Reads go through a server that stays up the whole test.
	read := own.ServerClient(other)
	e.waitCount(read, len(keys), 20*time.Second)
	want := len(keys)

	// Lost: instances missing from Consul at the worst of polls every
	// 20 ms through the stops (reads that fail during an election skip).
	var floor, worst, polls, failed atomic.Int64
	floor.Store(int64(want))
	pollCtx, stopPolls := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-pollCtx.Done():
				return
			case <-tk.C:
			}
			n, _, err := fixture.ClusterServiceCount(read, e.cluster)
			if err != nil {
				failed.Add(1)
			} else {
				polls.Add(1)
				if missing := floor.Load() - int64(n); missing > worst.Load() {
					worst.Store(missing)
				}
			}
		}
	})
	defer func() { stopPolls(); wg.Wait() }()

	ports := map[string]int32{"http": 80}
	for step, stop := range []int{follower, leader} {
		before := indexes(t, read, names, e.node())
		must(t, own.StopServer(stop))
		stopped := time.Now()
		svc := names[step]
		must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, svc, fmt.Sprintf("after-stop-%d", step), discoveryv1.AddressTypeIPv4, ports, fixture.IPs(210+step, 0, 1))))
		want++
		eventually(t, 3*timeout, fmt.Sprintf("%d instances after stopping server %d", want, stop), func() error {
			n, _, err := fixture.ClusterServiceCount(read, e.cluster)
			if err != nil || n != want {
				return fmt.Errorf("%d instances (%v)", n, err)
			}
			return nil
		})
		floor.Store(int64(want))
		took := time.Since(stopped)
		role := "a follower"
		if stop == leader {
			role = "the leader"
		}
		t.Logf("stopped %s (server %d, the one fleetsync talked to): the next change landed %s later through another server", role, stop, took.Round(time.Millisecond))
		if took > timeout {
			t.Errorf("the change took %s after the stop, more than the request deadline %s", took, timeout)
		}
		after := indexes(t, read, names, e.node())
		for id, i := range before {
			if after[id] != i {
				t.Errorf("instance %s rewritten (ModifyIndex %d -> %d): a write was sent twice", id, i, after[id])
			}
		}
		if len(after) != len(before)+1 {
			t.Errorf("%d instances after, %d before: want exactly one more", len(after), len(before))
		}
		if stop == follower {
			// Back, so that the leader's stop keeps a quorum.
			must(t, own.StartServer(e.ctx, stop))
		}
	}
	var failovers []string
	for _, l := range strings.Split(d.LogTail(2000), "\n") {
		if strings.Contains(l, "Consul server failed; using the next address") {
			failovers = append(failovers, strings.TrimSpace(l))
		}
	}
	if len(failovers) == 0 {
		t.Fatal("no failover in the log")
	}
	t.Logf("%d failovers; first: %s", len(failovers), failovers[0])
	stopPolls()
	wg.Wait()
	t.Logf("FIGURES TestFailoverBetweenServers: lost=%d (worst of %d polls every 20ms that Consul answered; %d got no answer)", worst.Load(), polls.Load(), failed.Load())
	if worst.Load() != 0 {
		t.Errorf("%d instances missing from Consul at the worst poll", worst.Load())
	}
}

// indexes maps the ID of every instance of the services to its ModifyIndex.
func indexes(t *testing.T, c *consulapi.Client, names []string, node string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, n := range names {
		ins, err := fixture.Instances(c, n, node)
		must(t, err)
		for _, in := range ins {
			out[in.ID] = in.ModifyIndex
		}
	}
	return out
}
