package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// Tests of docs/reliability.md's rows on faults in Consul: Consul losing
// or rolling back its data while other Services write, someone else's
// entry under our ID, a look-alike node, a Consul that never answers, and
// a cluster-id claim lost to another Kubernetes cluster.

// catalogKeys returns "name/addr:port" of every entry on node and on the
// nodes the cluster spreads over with it (node.<n>).
func catalogKeys(c *consulapi.Client, node string) (map[string]bool, error) {
	nodes, _, err := c.Catalog().Nodes(nil)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, n := range nodes {
		if !fixture.OnClusterNode(n.Node, node) {
			continue
		}
		list, _, err := c.Catalog().NodeServiceList(n.Node, nil)
		if err != nil {
			return nil, err
		}
		if list == nil {
			continue
		}
		for _, s := range list.Services {
			out[fmt.Sprintf("%s/%s:%d", s.Service, s.Address, s.Port)] = true
		}
	}
	return out, nil
}

// missingAndExtra compares want with Consul's entries of the named
// services (a nil names: all).
func missingAndExtra(have, want map[string]bool, names map[string]bool) (missing, extra []string) {
	for k := range want {
		if !have[k] {
			missing = append(missing, k)
		}
	}
	for k := range have {
		if names == nil || names[strings.SplitN(k, "/", 2)[0]] {
			if !want[k] {
				extra = append(extra, k)
			}
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	return missing, extra
}

// churner moves one endpoint of a Service every period until stopped, and
// knows the Service's last state.
type churner struct {
	e      *env
	name   string
	base   int
	period time.Duration
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	last   []fixture.EP
	rounds int
}

func startChurn(t *testing.T, e *env, name string, base, eps int, period time.Duration) *churner {
	t.Helper()
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, name, map[string]string{optIn: "true"}, ports)))
	c := &churner{e: e, name: name, base: base, period: period, stop: make(chan struct{}), done: make(chan struct{}), last: fixture.IPs(base, 0, eps)}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-s", discoveryv1.AddressTypeIPv4, ports, c.last)))
	go func() {
		defer close(c.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for r := 1; ; r++ {
			select {
			case <-c.stop:
				return
			case <-t.C:
			}
			eps := fixture.IPs(base, r, len(c.last)) // one endpoint in, one out
			if err := fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-s", discoveryv1.AddressTypeIPv4, ports, eps)); err == nil {
				c.mu.Lock()
				c.last, c.rounds = eps, r
				c.mu.Unlock()
			}
		}
	}()
	return c
}

// finish stops the churn and returns the Service's last keys.
func (c *churner) finish() (map[string]bool, int) {
	close(c.stop)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := map[string]bool{}
	for _, ep := range c.last {
		keys[fmt.Sprintf("%s/%s:80", c.name, ep.IP)] = true
	}
	return keys, c.rounds
}

// waitExact waits until the node holds want for the named services and
// returns how long that took.
func waitExact(t *testing.T, c *consulapi.Client, node string, want, names map[string]bool, timeout time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	var missing, extra []string
	for time.Since(start) < timeout {
		have, err := catalogKeys(c, node)
		if err == nil {
			if missing, extra = missingAndExtra(have, want, names); len(missing) == 0 && len(extra) == 0 {
				return time.Since(start)
			}
		}
		time.Sleep(50 * time.Millisecond) // a poll of Consul: there is no event to await
	}
	t.Fatalf("%s: not exact after %s: %d missing (e.g. %v), %d extra (e.g. %v)", what, timeout, len(missing), head(missing), len(extra), head(extra))
	return 0
}

func head(s []string) []string { return s[:min(3, len(s))] }

// keysOf turns svcSet's keys into a set and its names into a set.
func keysOf(keys, names []string) (map[string]bool, map[string]bool) {
	k, n := map[string]bool{}, map[string]bool{}
	for _, x := range keys {
		k[x] = true
	}
	for _, x := range names {
		n[x] = true
	}
	return k, n
}

// TestConsulRestartsEmptyWhileBusy: 200 Services x 5 endpoints, default
// flags; one Service keeps changing (an endpoint moves every 300 ms) while
// Consul restarts empty. Its first write re-creates the cluster's node, so
// "does our node exist" is no longer enough: every instance of the 199
// quiet Services must be back within 10 s of Consul answering again.
func TestConsulRestartsEmptyWhileBusy(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	names, keys := svcSet(t, e, "quiet", 199, 5, 0)
	busy := startChurn(t, e, "busy", 250, 5, 300*time.Millisecond)
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Addr, Namespaces: []string{e.ns}})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })
	want, quiet := keysOf(keys, names)
	waitExact(t, own.Client, e.node(), want, quiet, 60*time.Second, "cold start")

	must(t, own.Restart(e.ctx)) // returns once the agent answers, empty
	g := newGuard(t, own.Client, e.node(), names, nil)
	took := waitExact(t, own.Client, e.node(), want, quiet, 30*time.Second, "after Consul restarted empty")
	last, rounds := busy.finish()
	waitExact(t, own.Client, e.node(), last, map[string]bool{"busy": true}, 10*time.Second, "the busy Service")
	_, foreign := g.finish()
	t.Logf("FIGURES %s: all %d instances of the %d quiet Services back %s after Consul answered again (busy Service changed %d times meanwhile); foreign=%d",
		t.Name(), len(keys), len(names), took.Round(time.Millisecond), rounds, foreign)
	if took > 10*time.Second || foreign != 0 {
		t.Fatalf("back after %s (want <= 10s), foreign touched %d", took, foreign)
	}
}

// TestSnapshotRestoreRepairs: a Consul server that keeps its data is
// restored from an older snapshot: instances registered after it are
// missing, instances deregistered after it (dead pods) are back. Both are
// repaired within 10 s, with the cluster quiet and with a Service changing
// all along.
func TestSnapshotRestoreRepairs(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(map[bool]string{false: "quiet", true: "busy"}[busy], func(t *testing.T) {
			e := newEnv(t)
			own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{Servers: 1, ExtraArgs: []string{quietConsul}})
			must(t, err)
			t.Cleanup(func() { _ = own.Stop() })
			names, keys := svcSet(t, e, "snap", 20, 3, 0)
			var ch *churner
			if busy {
				ch = startChurn(t, e, "busy", 250, 5, 300*time.Millisecond)
			}
			d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
				ConsulAddr: own.Addr, Namespaces: []string{e.ns}})
			must(t, err)
			t.Cleanup(func() { d.CloseT(t) })
			want, set := keysOf(keys, names)
			waitExact(t, own.Client, e.node(), want, set, 30*time.Second, "cold start")
			snap, err := own.SnapshotSave(e.ctx)
			must(t, err)

			// After the snapshot: snap-0 grows to 5 endpoints, snap-1
			// shrinks to 1 (two pods gone).
			ports := map[string]int32{"http": 80}
			must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, "snap-0", "snap-0-stable", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(0, 0, 5))))
			must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, "snap-1", "snap-1-stable", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 1))))
			for k := range want {
				if strings.HasPrefix(k, "snap-0/") || strings.HasPrefix(k, "snap-1/") {
					delete(want, k)
				}
			}
			for _, ep := range fixture.IPs(0, 0, 5) {
				want["snap-0/"+ep.IP+":80"] = true
			}
			want["snap-1/"+fixture.IPs(1, 0, 1)[0].IP+":80"] = true
			waitExact(t, own.Client, e.node(), want, set, 10*time.Second, "after the changes")

			must(t, own.SnapshotRestore(e.ctx, snap))
			took := waitExact(t, own.Client, e.node(), want, set, 30*time.Second, "after the snapshot restore")
			if ch != nil {
				last, _ := ch.finish()
				waitExact(t, own.Client, e.node(), last, map[string]bool{"busy": true}, 10*time.Second, "the busy Service")
			}
			t.Logf("FIGURES %s: 2 missing and 2 resurrected instances repaired %s after the restore", t.Name(), took.Round(time.Millisecond))
			if took > 10*time.Second {
				t.Fatalf("repaired after %s, want <= 10s", took)
			}
		})
	}
}

// restoreFleet starts a Consul server with a data dir of the test's own
// (one that can save and restore snapshots), n Services of eps endpoints
// (svcSet) and a daemon with args, and waits until Consul holds them: the
// environment, the server, the Services' names, the instances and names
// as waitExact takes them.
func restoreFleet(t *testing.T, prefix string, n, eps, base int, args ...string) (*env, *stack.Consul, []string, map[string]bool, map[string]bool) {
	t.Helper()
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{Servers: 1, ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	names, keys := svcSet(t, e, prefix, n, eps, base)
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Addr, Namespaces: []string{e.ns}, Args: args})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })
	want, set := keysOf(keys, names)
	waitExact(t, own.Client, e.node(), want, set, 30*time.Second, "cold start")
	return e, own, names, want, set
}

// TestRestoreAfterAServiceWentRepairs: a Service whose one instance is
// our latest write is deleted (its worker deletes the instance and ends),
// then Consul is restored from a snapshot taken before that, which brings
// the instance back; another Service writes right after the restore,
// which lifts the node's index above everything fleetsync saw, so the
// index check cannot tell. The delete is the only evidence, and the
// instance must be gone again within seconds. Each of three rules fails
// this test when reverted: the delete stays a witness after its
// worker ended; the check reads every witness from its last complete check
// on (by age alone it never read the delete, 70 ms older than the write
// after the restore); the delete's witness sits above the entry's own
// index (it sat at it, our latest write, and the entry back there read as
// someone's later write). The node check runs every 5 s here, so that the
// write after the restore nearly always lands before it.
func TestRestoreAfterAServiceWentRepairs(t *testing.T) {
	e, own, names, want, set := restoreFleet(t, "went", 3, 3, 60, "--node-check-interval=5s")
	// The Service to delete is left with one instance, our latest write:
	// its delete's witness must sit above that write's index (at it, the
	// entry back at it would read as someone's later write).
	gone := names[0]
	ports := map[string]int32{"http": 80}
	last := fixture.IPs(60, 5, 1)
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, gone, gone+"-stable", discoveryv1.AddressTypeIPv4, ports, last)))
	for k := range want {
		if strings.HasPrefix(k, gone+"/") {
			delete(want, k)
		}
	}
	want[fmt.Sprintf("%s/%s:80", gone, last[0].IP)] = true
	waitExact(t, own.Client, e.node(), want, set, 10*time.Second, "after the last write")
	snap, err := own.SnapshotSave(e.ctx)
	must(t, err)

	must(t, kube.Client.CoreV1().Services(e.ns).Delete(e.ctx, gone, metav1.DeleteOptions{}))
	for k := range want {
		if strings.HasPrefix(k, gone+"/") {
			delete(want, k)
		}
	}
	waitExact(t, own.Client, e.node(), want, set, 10*time.Second, "after the Service was deleted")

	must(t, own.SnapshotRestore(e.ctx, snap))
	// A new instance of another Service, right away: a create, which no
	// CAS refuses, on the same node.
	grown := fixture.IPs(61, 0, 4)
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[1], names[1]+"-stable", discoveryv1.AddressTypeIPv4, ports, grown)))
	want[fmt.Sprintf("%s/%s:80", names[1], grown[3].IP)] = true
	took := waitExact(t, own.Client, e.node(), want, set, 20*time.Second, "after the restore")
	t.Logf("FIGURES %s: the deleted Service's instance, brought back by the restore, gone again %s after it", t.Name(), took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("repaired after %s, want <= 10s", took)
	}
}

// TestReadinessChangeUndoneByARestoreRepairs: an endpoint starts draining,
// which rewrites only its instance's check (no node index moves, no
// service index either), and Consul is restored from a snapshot taken
// before that: the check is passing again while the pod drains. The
// witness of that write holds the check's index, so the node check sees
// it and the worker sets the check back within seconds (without the
// check's index in the witness it stays passing until the Service's
// anti-entropy pass, up to 5.5 min). Nothing else writes after the
// restore, so the catalog's marks may be back exactly where a check left
// them: a witness newer than that check forbids the skip on them.
func TestReadinessChangeUndoneByARestoreRepairs(t *testing.T) {
	e, own, names, want, set := restoreFleet(t, "drain", 3, 2, 70)
	snap, err := own.SnapshotSave(e.ctx)
	must(t, err)

	name, eps := names[0], fixture.IPs(70, 0, 2)
	status := func() string {
		entries, _, err := own.Client.Health().Service(name, "", false, nil)
		if err != nil {
			return "unread: " + err.Error()
		}
		for _, en := range entries {
			if en.Service.Address != eps[0].IP {
				continue
			}
			for _, c := range en.Checks {
				if c.ServiceID == en.Service.ID {
					return c.Status
				}
			}
		}
		return "no check"
	}
	waitStatus := func(want string, timeout time.Duration, what string) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < timeout {
			if status() == want {
				return time.Since(start)
			}
			time.Sleep(50 * time.Millisecond) // a poll of Consul: there is no event to await
		}
		t.Fatalf("%s: the draining instance's check is %q after %s, want %q", what, status(), timeout, want)
		return 0
	}
	eps[0].Terminating = true
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-stable", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 80}, eps)))
	waitStatus(consulapi.HealthWarning, 10*time.Second, "after the drain began")

	must(t, own.SnapshotRestore(e.ctx, snap))
	if got := status(); got != consulapi.HealthPassing {
		t.Fatalf("after the restore the check is %q, want %q (the snapshot's)", got, consulapi.HealthPassing)
	}
	took := waitStatus(consulapi.HealthWarning, 15*time.Second, "after the restore")
	waitExact(t, own.Client, e.node(), want, set, 10*time.Second, "the instances after the restore")
	t.Logf("FIGURES %s: the draining instance's check, passing again after the restore, back to warning %s after it", t.Name(), took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("repaired after %s, want <= 10s", took)
	}
}

// TestTamperedEntryDoesNotFreezeTheService: someone re-registers one of our
// instances (same node, same ID) without our mark. After a restart (a
// fresh read), the Service scales from 3 endpoints to 4 with one removed:
// everything but the tampered entry converges within one window, the
// tampered entry stays untouched, and it is reported once.
func TestTamperedEntryDoesNotFreezeTheService(t *testing.T) {
	e := newEnv(t)
	names, _ := svcSet(t, e, "tamper", 1, 3, 40)
	name := names[0]
	d := e.daemon()
	ins := e.waitInstances(name, fixture.Keys(mkInstances(fixture.IPs(40, 0, 3)), true))
	victim := ins[0]
	for _, in := range ins {
		if in.Address < victim.Address {
			victim = in
		}
	}
	// The tamperer keeps the ID and address, drops our tags and meta.
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: e.node(), Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: victim.ID, Service: name, Address: victim.Address, Port: victim.Port,
			Tags: []string{"theirs"}, Meta: map[string]string{"owner": "someone-else"}}}, nil)
	must(t, err)
	tamperedIndex := entryIndex(t, e.node(), victim.ID)
	must(t, d.Restart(e.ctx, false))
	must(t, d.WaitReady(e.ctx, 30*time.Second))

	// 3 -> 4 endpoints, one removed: .1 .2 .3 become .1 .2 .4 .5.
	eps := append(fixture.IPs(40, 0, 2), fixture.IPs(40, 3, 2)...)
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-stable", discoveryv1.AddressTypeIPv4, ports, eps)))
	want := map[string]bool{}
	for _, ep := range eps {
		want[name+"/"+ep.IP+":80"] = true
	}
	took := waitExact(t, consul.Client, e.node(), want, map[string]bool{name: true}, 10*time.Second, "the rest of the Service")
	if got := entryIndex(t, e.node(), victim.ID); got != tamperedIndex {
		t.Fatalf("the tampered entry was modified (index %d -> %d)", tamperedIndex, got)
	}
	eventually(t, 10*time.Second, "one ConsulEntryNotOurs event", func() error {
		list, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=ConsulEntryNotOurs"})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 || list.Items[0].Count != 1 || !strings.Contains(list.Items[0].Message, victim.ID) {
			return fmt.Errorf("events %+v", list.Items)
		}
		return nil
	})
	if line, ok := metricLine(scrape(t, d), "fleetsync_fleet_blocked_instances "); !ok || !strings.HasSuffix(line, " 1") {
		t.Errorf("blocked instances metric %q, want 1", line)
	}
	t.Logf("FIGURES %s: the rest of the Service converged %s after the change; the tampered entry untouched, reported once",
		t.Name(), took.Round(time.Millisecond))
	if took > 2*time.Second { // one window (1s) and a margin
		t.Fatalf("converged after %s, want within one window", took)
	}
}

func mkInstances(eps []fixture.EP) []fixture.Instance {
	var out []fixture.Instance
	for _, ep := range eps {
		out = append(out, fixture.Instance{Address: ep.IP, Port: 80, Status: "passing"})
	}
	return out
}

func entryIndex(t *testing.T, node, id string) uint64 {
	t.Helper()
	list, _, err := consul.Client.Catalog().NodeServiceList(node, nil)
	must(t, err)
	for _, s := range list.Services {
		if s.ID == id {
			return s.ModifyIndex
		}
	}
	t.Fatalf("no entry %s on %s", id, node)
	return 0
}

// TestLookAlikeNodeIsNeverWritten: a node named k8s-<cluster-id> that
// someone else registered (own address, meta and service) exists before
// fleetsync starts. fleetsync writes nothing onto it, says why (/readyz,
// log, metric), and syncs once the node is gone.
func TestLookAlikeNodeIsNeverWritten(t *testing.T) {
	e := newEnv(t)
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: e.node(), Address: "10.9.9.9",
		NodeMeta: map[string]string{"team": "payments"},
		Service:  &consulapi.AgentService{ID: "billing-1", Service: "billing", Port: 9000}}, nil)
	must(t, err)
	before, _, err := consul.Client.Catalog().Node(e.node(), nil)
	must(t, err)
	names, keys := svcSet(t, e, "alike", 2, 2, 45)
	d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: consul.Addr, Namespaces: []string{e.ns}})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })
	eventually(t, 20*time.Second, "/readyz names the look-alike node", func() error {
		code, body, err := d.Get(e.ctx, "/readyz", "")
		if err != nil || code != 503 || !strings.Contains(body, e.node()) || !strings.Contains(body, "10.9.9.9") {
			return fmt.Errorf("%d %q %v", code, body, err)
		}
		return nil
	})
	if line, ok := metricLine(scrape(t, d), "fleetsync_consul_foreign_nodes "); !ok || !strings.HasSuffix(line, " 1") {
		t.Errorf("foreign nodes metric %q, want 1", line)
	}
	if !strings.Contains(d.LogTail(200), "A node named like ours is someone else's") {
		t.Errorf("no log line about the look-alike node")
	}
	after, _, err := consul.Client.Catalog().Node(e.node(), nil)
	must(t, err)
	if after.Node.ModifyIndex != before.Node.ModifyIndex || after.Node.Address != "10.9.9.9" || after.Node.Meta["team"] != "payments" ||
		len(after.Services) != 1 || after.Services["billing-1"].ModifyIndex != before.Services["billing-1"].ModifyIndex {
		t.Fatalf("the look-alike node changed: before %+v %v, after %+v %v", before.Node, before.Services, after.Node, after.Services)
	}
	// Its owner removes it: our Services sync, the daemon is ready.
	_, err = consul.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: e.node()}, nil)
	must(t, err)
	want, set := keysOf(keys, names)
	waitExact(t, consul.Client, e.node(), want, set, 40*time.Second, "after the look-alike node went")
	must(t, d.WaitReady(e.ctx, 10*time.Second))
	t.Logf("FIGURES %s: look-alike node untouched (index %d, address 10.9.9.9, its service unchanged); synced once it went", t.Name(), after.Node.ModifyIndex)
}

// TestHungConsulCostsABoundedDelay: a proxy in front of Consul holds every
// transaction of four "stuck" Services forever (they are read, never
// answered), more than the two write slots of --consul-max-inflight=2.
// Other Services' changes still land, each within the request deadline
// plus a margin; every held request is let go by the client at its
// deadline; once the proxy passes them again, the stuck Services land too.
func TestHungConsulCostsABoundedDelay(t *testing.T) {
	e := newEnv(t)
	proxy, err := fixture.NewStallProxy(consul.Addr)
	must(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	proxy.Stall(func(r *http.Request, body []byte) bool {
		return r.URL.Path == "/v1/txn" && strings.Contains(string(body), `"stuck-`)
	})
	const timeout = 2 * time.Second
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: proxy.Addr(), Namespaces: []string{e.ns},
		Args: []string{"--consul-request-timeout=" + timeout.String(), "--consul-max-inflight=2"}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(40))
		}
		d.CloseT(t)
	})
	warm, warmKeys := svcSet(t, e, "warm", 1, 1, 49) // the node exists before anything hangs
	wk, ws := keysOf(warmKeys, warm)
	waitExact(t, consul.Client, e.node(), wk, ws, 20*time.Second, "the first Service")
	goroutines := metricValue(scrape(t, d), "go_goroutines")
	stuck, stuckKeys := svcSet(t, e, "stuck", 4, 2, 50)
	wctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	must(t, proxy.WaitHeld(wctx, 2))

	// While the stuck Services' transactions hang and retry, others change.
	var worst time.Duration
	for i := range 3 {
		names, keys := svcSet(t, e, fmt.Sprintf("free%d", i), 1, 2, 60+i)
		start := time.Now()
		want, set := keysOf(keys, names)
		waitExact(t, consul.Client, e.node(), want, set, 4*timeout, "a free Service while others hang")
		worst = max(worst, time.Since(start))
	}
	// Every held request is let go when the client's deadline passes.
	eventually(t, 2*timeout, "held requests released by their deadline", func() error {
		if n := proxy.Held(); n > 2 {
			return fmt.Errorf("%d held", n)
		}
		return nil
	})
	held := proxy.Total()
	proxy.Stall(nil)
	want, set := keysOf(stuckKeys, stuck)
	waitExact(t, consul.Client, e.node(), want, set, 45*time.Second, "the stuck Services once Consul answers")
	// Nothing the hung requests started is left: the goroutine count is
	// back to what it was before they hung (8 more Services' workers aside).
	var now float64
	eventually(t, 10*time.Second, "goroutines back to the count before the hang", func() error {
		if now = metricValue(scrape(t, d), "go_goroutines"); now > goroutines+8+4 {
			return fmt.Errorf("%v goroutines, %v before the hang", now, goroutines)
		}
		return nil
	})
	t.Logf("FIGURES %s: %d transactions held by the proxy; other Services' changes landed within %s (request deadline %s, 2 write slots); goroutines %v before, %v after",
		t.Name(), held, worst.Round(time.Millisecond), timeout, goroutines, now)
	if worst > timeout+3*time.Second {
		t.Fatalf("a free Service waited %s, more than the deadline plus 3s", worst)
	}
}

// TestClaimLostToAnotherClusterStopsWrites: the cluster id's claim is lost
// while fleetsync runs (its session deleted while it cannot reach Consul's
// KV store), and a second Kubernetes cluster started with the same
// --cluster-id takes it. The first daemon writes nothing more, above all
// deletes nothing, goes unready and says why.
func TestClaimLostToAnotherClusterStopsWrites(t *testing.T) {
	e := newEnv(t)
	proxy, err := fixture.NewStallProxy(consul.Addr)
	must(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	names, keys := svcSet(t, e, "claim", 2, 2, 70)
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: proxy.Addr(), Namespaces: []string{e.ns}, Args: []string{"--consul-request-timeout=2s"}})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })
	want, set := keysOf(keys, names)
	waitExact(t, consul.Client, e.node(), want, set, 20*time.Second, "synced")

	// The daemon cannot reach the KV store or its session; meanwhile its
	// session is deleted (the lock goes) and another cluster takes the id.
	proxy.Stall(func(r *http.Request, _ []byte) bool {
		return strings.HasPrefix(r.URL.Path, "/v1/kv/") || strings.HasPrefix(r.URL.Path, "/v1/session/")
	})
	key := "fleetsync/clusters/" + e.cluster
	pair, _, err := consul.Client.KV().Get(key, nil)
	must(t, err)
	if pair == nil || pair.Session == "" {
		t.Fatalf("claim %s not held: %+v", key, pair)
	}
	_, err = consul.Client.Session().Destroy(pair.Session, nil)
	must(t, err)
	other, err := stack.StartKube(e.ctx, stack.KubeOptions{})
	must(t, err)
	t.Cleanup(func() { _ = other.Stop() })
	must(t, fixture.Namespace(e.ctx, other.Client, e.ns))
	impostor, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: other.KubeconfigPath,
		ConsulAddr: consul.Addr, Namespaces: []string{e.ns}, Name: "fleetsync-impostor", Args: []string{"--takeover-cluster-id"}})
	must(t, err)
	t.Cleanup(func() { impostor.CloseT(t) })
	proxy.Stall(nil)
	txnsBefore := committedTxns(t, d)

	// A change in the first cluster: a new endpoint and a deleted Service.
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[0], names[0]+"-stable", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(70, 0, 3))))
	must(t, kube.Client.CoreV1().Services(e.ns).Delete(e.ctx, names[1], metav1.DeleteOptions{}))
	eventually(t, 20*time.Second, "/readyz says the claim is lost", func() error {
		code, body, err := d.Get(e.ctx, "/readyz", "")
		if err != nil || code != 503 || !strings.Contains(body, "writing stopped") || !strings.Contains(body, "claimed") {
			return fmt.Errorf("%d %q %v", code, body, err)
		}
		return nil
	})
	eventually(t, 20*time.Second, "a write attempt refused", func() error {
		if !strings.Contains(d.LogTail(400), "Cluster-id claim lost to another Kubernetes cluster") {
			return fmt.Errorf("no log line yet")
		}
		return nil
	})
	if got := committedTxns(t, d); got != txnsBefore {
		t.Fatalf("the first daemon committed %v transactions after it lost the claim", got-txnsBefore)
	}
	have, err := catalogKeys(consul.Client, e.node())
	must(t, err)
	if newEP := names[0] + "/" + fixture.IPs(70, 2, 1)[0].IP + ":80"; have[newEP] {
		t.Fatalf("the first daemon registered %s after losing the claim", newEP)
	}
	t.Logf("FIGURES %s: after the claim was taken, the first daemon committed 0 transactions; /readyz and its log say why", t.Name())
}

// committedTxns is the daemon's count of committed transactions.
func committedTxns(t *testing.T, d *fixture.Daemon) float64 {
	t.Helper()
	body := scrape(t, d)
	total, errs := metricValue(body, "fleetsync_consul_txn_duration_seconds_count"), metricValue(body, "fleetsync_consul_txn_errors_total")
	return total - errs
}

func metricValue(body, name string) float64 {
	line, ok := metricLine(body, name+" ")
	if !ok {
		return 0
	}
	var v float64
	fmt.Sscanf(strings.TrimPrefix(line, name+" "), "%g", &v)
	return v
}
