package e2e

import (
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/test/fixture"
)

// clusterNodes is fixture.ClusterNodes, failing the test on an error.
func clusterNodes(t *testing.T, cluster string) map[string][]string {
	t.Helper()
	placed, err := fixture.ClusterNodes(consul.Client, cluster)
	must(t, err)
	return placed
}

// TestSpreadOverConsulNodes: with --consul-nodes=4 a cluster's instances
// spread over k8s-<id>, k8s-<id>.1, .2 and .3, every Service's instances on
// the node of its hash; a restart with the same nodes writes nothing; with
// 2 nodes, each Service whose node changed moves in one transaction; a
// Service deleted while the daemon is down leaves its node, and purge
// removes every node of the cluster.
func TestSpreadOverConsulNodes(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	const services, perService, nodes = 40, 3, 4
	ports := map[string]int32{"http": 80}
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, name, map[string]string{optIn: "true"}, ports)))
		must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, name, name+"-a", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(i, 0, perService))))
	}
	cluster, err := ownership.New(e.cluster)
	must(t, err)
	spread, err := cluster.WithNodes(nodes)
	must(t, err)
	d := e.daemon(fmt.Sprintf("--consul-nodes=%d", nodes))
	want := services * perService
	var placed map[string][]string
	eventually(t, 30*time.Second, "all instances registered", func() error {
		placed = clusterNodes(t, e.cluster)
		n := 0
		for _, ids := range placed {
			n += len(ids)
		}
		if n != want {
			return fmt.Errorf("%d of %d instances on %d nodes", n, want, len(placed))
		}
		return nil
	})
	var names []string
	for node, ids := range placed {
		names = append(names, fmt.Sprintf("%s=%d", node, len(ids)))
		for _, id := range ids {
			if at := spread.NodeNameFor(id); at != node {
				t.Errorf("instance %s on %s, want %s", id, node, at)
			}
		}
	}
	sort.Strings(names)
	t.Logf("%d instances of %d Services on %d nodes: %s", want, services, len(placed), strings.Join(names, " "))
	if len(placed) != nodes {
		t.Fatalf("instances on %d nodes, want %d", len(placed), nodes)
	}

	// Restart with the same nodes: nothing is written.
	restart := func() float64 {
		t.Helper()
		txns := catalogTxns(t)
		must(t, d.Restart(ctx, false))
		must(t, d.WaitReady(ctx, 30*time.Second))
		return catalogTxns(t) - txns
	}
	if w := restart(); w != 0 {
		t.Errorf("restart with the same --consul-nodes: %v catalog writes, want 0", w)
	}
	// With two nodes: every Service not on node 0 or 1 of two moves, one
	// transaction each (delete on the old node and register on the new in
	// the same transaction, so it never leaves Consul); the others stay.
	two, err := cluster.WithNodes(2)
	must(t, err)
	moves := 0
	for i := range services {
		id := cluster.InstanceID(e.ns, fmt.Sprintf("svc-%d", i), "10.0.0.1", 80)
		if spread.NodeNameFor(id) != two.NodeNameFor(id) {
			moves++
		}
	}
	txns := catalogTxns(t)
	d.Args = append(append([]string{}, d.Args...), "--consul-nodes=2")
	must(t, d.Restart(ctx, false))
	must(t, d.WaitReady(ctx, 30*time.Second))
	eventually(t, 30*time.Second, "every Service on its node of two", func() error {
		n := 0
		for node, ids := range clusterNodes(t, e.cluster) {
			for _, id := range ids {
				if want := two.NodeNameFor(id); want != node {
					return fmt.Errorf("%s on %s, want %s", id, node, want)
				}
				n++
			}
		}
		if n != want {
			return fmt.Errorf("%d of %d instances", n, want)
		}
		return nil
	})
	if w := catalogTxns(t) - txns; w != float64(moves) {
		t.Errorf("from 4 nodes to 2: %v catalog writes, want %d (one per Service that moved)", w, moves)
	}
	t.Logf("from 4 nodes to 2: %d of %d Services moved, one transaction each", moves, services)
	if w := restart(); w != 0 {
		t.Errorf("restart with the same --consul-nodes=2: %v catalog writes, want 0", w)
	}

	// Delete a Service that is not on the first node while the daemon is
	// down: after the restart its instances leave their node.
	var victim, victimNode string
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		if n := two.NodeNameFor(cluster.InstanceID(e.ns, name, "10.0.0.1", 80)); n != cluster.NodeName() {
			victim, victimNode = name, n
			break
		}
	}
	must(t, d.Stop())
	must(t, c.CoreV1().Services(e.ns).Delete(ctx, victim, metav1.DeleteOptions{}))
	must(t, d.Restart(ctx, false))
	must(t, d.WaitReady(ctx, 30*time.Second))
	eventually(t, 15*time.Second, victim+" deregistered from "+victimNode, func() error {
		for _, id := range clusterNodes(t, e.cluster)[victimNode] {
			if strings.HasPrefix(id, cluster.IDPrefix(e.ns, victim)) {
				return fmt.Errorf("%s still on %s", id, victimNode)
			}
		}
		return nil
	})

	// Purge (the daemon stopped, its claim released): every node goes.
	must(t, d.Stop())
	bin, err := fixture.Build()
	must(t, err)
	out, err := exec.CommandContext(ctx, bin, "purge", "--cluster-id="+e.cluster, "--consul-address="+consul.Addr, "--yes").CombinedOutput()
	t.Logf("fleetsync purge --yes:\n%s", out)
	if err != nil {
		t.Fatalf("purge: %v", err)
	}
	if left := clusterNodes(t, e.cluster); len(left) != 0 {
		t.Errorf("after purge the cluster still has nodes %v", left)
	}
	if !strings.Contains(string(out), fmt.Sprintf("Deregistered %d instances", want-perService)) {
		t.Errorf("purge output does not report %d instances", want-perService)
	}
}

// TestAutoConsulNodes: with the default --consul-nodes (0: chosen at
// start) 250 Services spread over 3 nodes (one per 100), each on the node
// of its consistent hash; a restart with 140 Services left keeps the 3
// nodes (50 to 200 per node are kept) and writes only the 110 deletions;
// with 80 left the cluster goes back to one node, moving only the Services
// that were not on it, one transaction each, never leaving Consul.
func TestAutoConsulNodes(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	const services = 250
	ports := map[string]int32{"http": 80}
	name := func(i int) string { return fmt.Sprintf("svc-%d", i) }
	for i := range services {
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, name(i), map[string]string{optIn: "true"}, ports)))
		must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, name(i), name(i)+"-a", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(i, 0, 1))))
	}
	cluster, err := ownership.New(e.cluster)
	must(t, err)
	layout := func(n int) ownership.Cluster {
		c, err := cluster.WithNodes(n)
		must(t, err)
		return c
	}
	// placedBy waits until Consul holds exactly the instances of the
	// first n Services, each on its node of spread, on nodes nodes.
	placedBy := func(n int, spread ownership.Cluster, nodes int) {
		t.Helper()
		eventually(t, 60*time.Second, fmt.Sprintf("%d Services on their nodes of %d", n, spread.Nodes()), func() error {
			placed := clusterNodes(t, e.cluster)
			got := 0
			for node, ids := range placed {
				for _, id := range ids {
					if want := spread.NodeNameFor(id); want != node {
						return fmt.Errorf("%s on %s, want %s", id, node, want)
					}
					got++
				}
			}
			if got != n {
				return fmt.Errorf("%d of %d instances", got, n)
			}
			if used := 0; true {
				for _, ids := range placed {
					if len(ids) > 0 {
						used++
					}
				}
				if used != nodes {
					return fmt.Errorf("instances on %d nodes, want %d", used, nodes)
				}
			}
			return nil
		})
	}
	chosen := func(d *fixture.Daemon) float64 { return metricValue(scrape(t, d), "fleetsync_consul_nodes") }

	d := e.daemon()
	placedBy(services, layout(3), 3)
	if n := chosen(d); n != 3 {
		t.Errorf("250 Services: fleetsync_consul_nodes = %v, want 3", n)
	}

	// 140 left (2 advised, 3 in use: kept). Only the 110 deletions write.
	must(t, d.Stop())
	for i := 140; i < services; i++ {
		must(t, c.CoreV1().Services(e.ns).Delete(ctx, name(i), metav1.DeleteOptions{}))
	}
	txns := catalogTxns(t)
	must(t, d.Restart(ctx, false))
	must(t, d.WaitReady(ctx, 30*time.Second))
	placedBy(140, layout(3), 3)
	if n := chosen(d); n != 3 {
		t.Errorf("140 Services on 3 nodes: fleetsync_consul_nodes = %v, want 3 (kept)", n)
	}
	if w := catalogTxns(t) - txns; w != 110 {
		t.Errorf("restart with 110 Services deleted: %v catalog writes, want 110 (the deletions, no move)", w)
	}

	// 80 left (1 advised, 3 in use: too many). Every Service not on the
	// first node moves there in one transaction; the 60 deletions write.
	must(t, d.Stop())
	for i := 80; i < 140; i++ {
		must(t, c.CoreV1().Services(e.ns).Delete(ctx, name(i), metav1.DeleteOptions{}))
	}
	moves := 0
	for i := range 80 {
		if layout(3).NodeNameFor(cluster.InstanceID(e.ns, name(i), "10.0.0.1", 80)) != cluster.NodeName() {
			moves++
		}
	}
	txns = catalogTxns(t)
	must(t, d.Restart(ctx, false))
	must(t, d.WaitReady(ctx, 30*time.Second))
	placedBy(80, layout(1), 1)
	if n := chosen(d); n != 1 {
		t.Errorf("80 Services on 3 nodes: fleetsync_consul_nodes = %v, want 1", n)
	}
	eventually(t, 15*time.Second, "the moves and deletions written", func() error {
		if w := catalogTxns(t) - txns; w != float64(60+moves) {
			return fmt.Errorf("%v catalog writes, want %d (60 deletions + %d moves)", w, 60+moves, moves)
		}
		return nil
	})
	t.Logf("3 nodes -> 1: %d of 80 Services moved, one transaction each", moves)
	txns = catalogTxns(t)
	must(t, d.Restart(ctx, false))
	must(t, d.WaitReady(ctx, 30*time.Second))
	placedBy(80, layout(1), 1)
	if w := catalogTxns(t) - txns; w != 0 {
		t.Errorf("restart on one node: %v catalog writes, want 0", w)
	}
}
