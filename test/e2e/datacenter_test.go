package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestAddressesOfTwoConsulClustersRefused: --consul-address names agents of
// two separate Consul clusters on loopback, first of two datacenters (dc1
// and dc2), then of two clusters that both call their datacenter dc1:
// fleetsync stops at start with an error naming both addresses and what
// each is, and writes nothing.
func TestAddressesOfTwoConsulClustersRefused(t *testing.T) {
	e := newEnv(t)
	svcSet(t, e, "twodc", 1, 1, 195)
	dc2, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul, "-datacenter=dc2"}})
	must(t, err)
	t.Cleanup(func() { _ = dc2.Stop() })
	other, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = other.Stop() })
	for _, tc := range []struct {
		name   string
		second *stack.Consul
		want   []string
	}{
		{"two datacenters", dc2, []string{`datacenter "dc1"`, `datacenter "dc2"`}},
		{"two clusters named dc1", other, []string{"another Consul cluster"}},
	} {
		d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
			ConsulAddr: consul.Addr + "," + tc.second.Addr, Namespaces: []string{e.ns}})
		must(t, err)
		err = waitExit(t, d, 30*time.Second)
		log := d.LogTail(40)
		d.CloseT(t)
		line := lastLineWith(log, "not one datacenter")
		for _, w := range append(tc.want, consul.Addr+" is", tc.second.Addr+" is") {
			if err == nil || !strings.Contains(line, w) {
				t.Fatalf("%s: exit %v; want an error naming %q; log:\n%s", tc.name, err, w, log)
			}
		}
		t.Logf("%s: %s", tc.name, line)
	}
	for _, c := range []*stack.Consul{consul, dc2, other} {
		if n, _ := fixture.NodeServiceCount(c.Client, e.node()); n != 0 {
			t.Fatalf("%d instances written to %s", n, c.Addr)
		}
	}
}

// TestDatacenterOnEveryRequestAndFailBack: fleetsync knows the three
// servers of one cluster, no --consul-datacenter. Every request it makes
// (seen in the first server's own request log) carries dc=dc1, the
// datacenter it read at start. The first server is stopped: requests go
// to another; it comes back: requests go back to it within seconds.
func TestDatacenterOnEveryRequestAndFailBack(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{Servers: 3, ExtraArgs: []string{quietConsul, "-log-level=debug"}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	leader, err := own.Leader(e.ctx)
	must(t, err)
	first, second, third := (leader+1)%3, leader, (leader+2)%3 // the first a follower: its stop keeps the leader
	_, keys := svcSet(t, e, "failback", 2, 2, 196)
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Server(first).Addr, Namespaces: []string{e.ns},
		Args: []string{"--consul-address=" + own.Server(second).Addr + "," + own.Server(third).Addr,
			"--consul-request-timeout=5s", "--window=0"}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(60))
		}
		d.CloseT(t)
	})
	read := own.ServerClient(third)
	e.waitCount(read, len(keys), 20*time.Second)
	if n := checkDC(t, own.Server(first).Agent().LogTail(1<<20), "dc1"); n == 0 {
		t.Fatal("the first server logged no request of fleetsync's")
	} else {
		t.Logf("%d requests of fleetsync's in the first server's log, each with dc=dc1", n)
	}

	must(t, own.StopServer(first))
	ports := map[string]int32{"http": 80}
	change := func(i int) {
		must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, "failback-0", fmt.Sprintf("change-%d", i), discoveryv1.AddressTypeIPv4, ports, fixture.IPs(196, 10+i, 1))))
	}
	change(0)
	e.waitCount(read, len(keys)+1, 15*time.Second)
	must(t, own.StartServer(e.ctx, first))
	started := time.Now()
	eventually(t, 30*time.Second, "requests back on the first server", func() error {
		if !strings.Contains(d.LogTail(400), "requests go back to it") {
			return fmt.Errorf("no failback in the log")
		}
		return nil
	})
	t.Logf("back on the first server %s after it started again", time.Since(started).Round(time.Millisecond))
	change(1)
	e.waitCount(read, len(keys)+2, 15*time.Second)
	eventually(t, 10*time.Second, "the change written through the first server", func() error {
		if n := strings.Count(own.Server(first).Agent().LogTail(1<<20), "url=/v1/txn?dc=dc1"); n == 0 {
			return fmt.Errorf("no transaction in the first server's log since its start")
		}
		return nil
	})
	checkDC(t, own.Server(first).Agent().LogTail(1<<20), "dc1")
}

// fleetsyncRequest matches a Consul agent's debug log line of a request
// only fleetsync makes (the harness reads other paths).
var fleetsyncRequest = regexp.MustCompile(`Request finished: method=\S+ url=(/v1/(txn|kv/|session/|health/service/|catalog/node-services/)\S*)`)

// checkDC fails t for each request of fleetsync's in log without
// dc=<dc>, and returns how many there are.
func checkDC(t *testing.T, log, dc string) int {
	t.Helper()
	n := 0
	for _, m := range fleetsyncRequest.FindAllStringSubmatch(log, -1) {
		n++
		if !strings.Contains(m[1], "dc="+dc) {
			t.Errorf("request %s without dc=%s", m[1], dc)
		}
	}
	return n
}

// TestUnknownDatacenterRefused: --consul-datacenter names a datacenter the
// Consul at --consul-address does not know (a typo): fleetsync stops at
// start naming it and the datacenter it knows, instead of retrying for
// ever on "No path to datacenter"; nothing is written.
func TestUnknownDatacenterRefused(t *testing.T) {
	e := newEnv(t)
	svcSet(t, e, "nodc", 1, 1, 197)
	d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: consul.Addr, Namespaces: []string{e.ns}, Args: []string{"--consul-datacenter=dc9"}})
	must(t, err)
	err = waitExit(t, d, 30*time.Second)
	log := d.LogTail(40)
	d.CloseT(t)
	line := lastLineWith(log, "no such datacenter")
	for _, w := range []string{`"dc9"`, "knows dc1"} {
		if err == nil || !strings.Contains(line, w) {
			t.Fatalf("exit %v; want an error naming %q; log:\n%s", err, w, log)
		}
	}
	if n, _ := fixture.NodeServiceCount(consul.Client, e.node()); n != 0 {
		t.Fatalf("%d instances written", n)
	}
}
