package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// Each fault test reports three figures (docs/reliability.md):
//
//	lost    live instances missing from Consul at some poll while their
//	        endpoints stayed ready (worst poll)
//	foreign instances fleetsync does not own that were modified or removed
//	wasted  catalog writes beyond those the fault made necessary
func figures(t *testing.T, lost, foreign int, writes, necessary float64) {
	t.Helper()
	wasted := writes - necessary
	if wasted < 0 {
		wasted = 0
	}
	t.Logf("FIGURES %s: lost=%d foreign=%d wasted=%v (catalog writes %v, necessary %v)", t.Name(), lost, foreign, wasted, writes, necessary)
	if lost != 0 || foreign != 0 || wasted != 0 {
		t.Errorf("lost=%d foreign=%d wasted=%v, want all 0", lost, foreign, wasted)
	}
}

// guard watches a set of instance keys that must stay in Consul and a
// foreign instance that must stay untouched.
type guard struct {
	t        *testing.T
	client   *consulapi.Client
	node     string
	services []string
	stable   map[string]bool // "name/addr:port" that must never be missing
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	worst    int
	foreign  uint64 // ModifyIndex of the foreign instance
}

func newGuard(t *testing.T, c *consulapi.Client, node string, services []string, stable []string) *guard {
	g := &guard{t: t, client: c, node: node, services: services, stable: map[string]bool{},
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, s := range stable {
		g.stable[s] = true
	}
	_, err := c.Catalog().Register(&consulapi.CatalogRegistration{Node: "foreign-" + node, Address: "127.0.0.8",
		Service: &consulapi.AgentService{ID: "foreign-" + node, Service: services[0], Address: "192.168.9.9", Port: 80}}, nil)
	must(t, err)
	g.foreign = g.foreignIndex()
	go g.watch()
	return g
}

func (g *guard) foreignIndex() uint64 {
	ins, err := fixture.Instances(g.client, g.services[0], "foreign-"+g.node)
	if err != nil || len(ins) != 1 {
		return 0
	}
	return ins[0].ModifyIndex
}

func (g *guard) watch() {
	defer close(g.done)
	for {
		present := map[string]bool{}
		ok := true
		for _, name := range g.services {
			ins, err := fixture.ClusterInstances(g.client, name, g.node)
			if err != nil {
				ok = false // Consul unreachable: not a loss we can see
				break
			}
			for _, in := range ins {
				present[name+"/"+in.Key()] = true
			}
		}
		if ok {
			missing := 0
			for k := range g.stable {
				if !present[k] {
					missing++
				}
			}
			g.mu.Lock()
			g.worst = max(g.worst, missing)
			g.mu.Unlock()
		}
		select {
		case <-g.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// finish stops watching and returns (lost, foreign touched).
func (g *guard) finish() (int, int) {
	close(g.stop)
	<-g.done
	touched := 0
	if g.foreignIndex() != g.foreign {
		touched = 1
	}
	return g.worst, touched
}

// svcSet creates n opted-in services named prefix-i with e endpoints each
// and returns their names and the "name/addr:port" keys of the endpoints.
func svcSet(t *testing.T, e *env, prefix string, n, eps, base int) ([]string, []string) {
	t.Helper()
	ports := map[string]int32{"http": 80}
	var names, keys []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, name, map[string]string{optIn: "true"}, ports)))
		set := fixture.IPs(base+i, 0, eps)
		must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-stable", discoveryv1.AddressTypeIPv4, ports, set)))
		names = append(names, name)
		for _, ep := range set {
			keys = append(keys, fmt.Sprintf("%s/%s:80", name, ep.IP))
		}
	}
	return names, keys
}

func (e *env) waitCount(c *consulapi.Client, want int, timeout time.Duration) {
	e.t.Helper()
	eventually(e.t, timeout, fmt.Sprintf("%d instances on the nodes of %s", want, e.cluster), func() error {
		n, nodes, err := fixture.ClusterServiceCount(c, e.cluster)
		if err != nil || n != want {
			return fmt.Errorf("%d instances on %d nodes (%v)", n, nodes, err)
		}
		return nil
	})
}

// TestDriftIsRepairedAndQuietPassesWriteNothing: with a 2 s anti-entropy
// period, passes over an unchanged catalog write nothing; an instance of
// ours deleted by hand and another edited by hand are repaired.
func TestDriftIsRepairedAndQuietPassesWriteNothing(t *testing.T) {
	e := newEnv(t)
	names, keys := svcSet(t, e, "drift", 5, 3, 40)
	e.daemon("--resync-period=2s")
	e.waitCount(consul.Client, len(keys), 15*time.Second)
	g := newGuard(t, consul.Client, e.node(), names, keys[3:]) // drift-0's instances will be hit on purpose

	before := catalogTxns(t)
	time.Sleep(5 * time.Second) // a measurement interval: one or two passes per worker
	quiet := catalogTxns(t) - before
	t.Logf("5 s of anti-entropy passes over an unchanged catalog: %v catalog writes", quiet)

	ins, err := fixture.Instances(consul.Client, "drift-0", e.node())
	must(t, err)
	_, err = consul.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: e.node(), ServiceID: ins[0].ID}, nil)
	must(t, err)
	edited := &consulapi.CatalogRegistration{Node: e.node(), Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: ins[1].ID, Service: "drift-0", Address: ins[1].Address, Port: 9999, Tags: ins[1].Tags, Meta: ins[1].Meta}}
	_, err = consul.Client.Catalog().Register(edited, nil)
	must(t, err)
	before = catalogTxns(t)
	e.waitInstancesWithin("drift-0", fmt.Sprintf("%s=passing,%s=passing,%s=passing", strings.TrimPrefix(keys[0], "drift-0/"),
		strings.TrimPrefix(keys[1], "drift-0/"), strings.TrimPrefix(keys[2], "drift-0/")), 10*time.Second)
	time.Sleep(3 * time.Second) // let every worker pass once more
	repair := catalogTxns(t) - before
	lost, foreign := g.finish()
	t.Logf("repair of one deleted and one edited instance: %v catalog writes", repair)
	figures(t, lost, foreign, quiet+repair, 1)
}

// TestConsulRestartsEmpty: Consul loses everything (a dev agent restarted);
// fleetsync notices that its node is gone and re-registers every instance,
// one transaction per service.
func TestConsulRestartsEmpty(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	names, keys := svcSet(t, e, "lost", 10, 3, 60)
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Addr, Namespaces: []string{e.ns}, Args: []string{"--node-check-interval=1s"}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(80))
		}
		d.CloseT(t)
	})
	e.waitCount(own.Client, len(keys), 15*time.Second)

	start := time.Now()
	must(t, own.Restart(e.ctx))
	g := newGuard(t, own.Client, e.node(), names, nil)
	e.waitCount(own.Client, len(keys), 30*time.Second)
	took := time.Since(start)
	time.Sleep(2 * time.Second) // nothing more may be written
	writes, err := own.CatalogTxns()
	must(t, err)
	_, foreign := g.finish()
	t.Logf("Consul restarted empty: all %d instances back %s after the restart, %v catalog writes", len(keys), took.Round(time.Millisecond), writes)
	figures(t, 0, foreign, writes, float64(len(names)))
}

// TestConsulDownThenBack: Consul is unreachable for a while as Services
// change; the daemon keeps running, /readyz says so, and when Consul is back
// (empty: a dev agent keeps nothing) every service converges to its latest
// state with one write per service.
func TestConsulDownThenBack(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	names, keys := svcSet(t, e, "down", 5, 2, 70)
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Addr, Namespaces: []string{e.ns}, Args: []string{"--node-check-interval=1s", "--consul-unreachable-grace=2s"}})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })
	e.waitCount(own.Client, len(keys), 15*time.Second)

	must(t, own.Kill())
	// 20 changes per service while Consul is away; the last one counts.
	ports := map[string]int32{"http": 80}
	for r := range 20 {
		for i, name := range names {
			must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-churn", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(80+i, r, 1))))
		}
	}
	eventually(t, 10*time.Second, "/readyz reports Consul down", func() error {
		code, body, err := d.Get(context.Background(), "/readyz", "")
		if err != nil || code != 503 || !strings.Contains(body, "consul unreachable") {
			return fmt.Errorf("%d %q %v", code, body, err)
		}
		return nil
	})
	if d.Exited() {
		t.Fatal("fleetsync exited while Consul was down")
	}
	must(t, own.Restart(e.ctx))
	g := newGuard(t, own.Client, e.node(), names, nil)
	want := len(keys) + len(names)
	e.waitCount(own.Client, want, 60*time.Second)
	for i, name := range names {
		last := fixture.IPs(80+i, 19, 1)[0].IP
		ins, err := fixture.Instances(own.Client, name, e.node())
		must(t, err)
		if !strings.Contains(fixture.Keys(ins, false), last+":80") {
			t.Errorf("%s: latest endpoint %s missing: %s", name, last, fixture.Keys(ins, false))
		}
	}
	time.Sleep(2 * time.Second)
	writes, err := own.CatalogTxns()
	must(t, err)
	_, foreign := g.finish()
	figures(t, 0, foreign, writes, float64(len(names)))
	must(t, d.WaitReady(e.ctx, 10*time.Second))
}

// TestGracefulShutdownFlushesPendingAndDeregistersNothing: a change that
// waits for its window when SIGTERM arrives is written before exit; nothing
// is deregistered because the daemon stops.
func TestGracefulShutdownFlushesPendingAndDeregistersNothing(t *testing.T) {
	e := newEnv(t)
	names, keys := svcSet(t, e, "drain", 3, 2, 90)
	d := e.daemon("--window=10s")
	e.waitCount(consul.Client, len(keys), 15*time.Second)
	g := newGuard(t, consul.Client, e.node(), names, keys)
	ports := map[string]int32{"http": 80}
	// The first change waits for the end of the window begun by the
	// bootstrap's flush (up to 10 s; on a loaded machine a little more);
	// the second then waits a whole window of its own.
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[0], "extra", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(99, 0, 1))))
	e.waitCount(consul.Client, len(keys)+1, 20*time.Second)
	before := catalogTxns(t)
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[0], "extra", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(99, 0, 2))))
	eventually(t, 5*time.Second, "the change pending", func() error {
		_, body, err := d.Get(e.ctx, "/debug/workers/"+e.ns+"/"+names[0], "")
		if err != nil || !strings.Contains(body, `"pending": true`) {
			return fmt.Errorf("not pending yet: %v", err)
		}
		return nil
	})
	start := time.Now()
	must(t, d.Terminate())
	t.Logf("SIGTERM to exit: %s", time.Since(start).Round(time.Millisecond))
	e.waitCount(consul.Client, len(keys)+2, time.Second) // already there: written before exit
	writes := catalogTxns(t) - before
	lost, foreign := g.finish()
	figures(t, lost, foreign, writes, 1)
}

// TestKill9MidChurnConverges: fleetsync is killed with SIGKILL while
// services churn and is started again; endpoints that stayed ready are never
// missing from Consul and the final state is exact.
func TestKill9MidChurnConverges(t *testing.T) {
	e := newEnv(t)
	names, keys := svcSet(t, e, "kill", 6, 2, 100)
	d := e.daemon("--window=200ms")
	e.waitCount(consul.Client, len(keys), 15*time.Second)
	g := newGuard(t, consul.Client, e.node(), names, keys)
	ports := map[string]int32{"http": 80}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	applied := make([]int, len(names)) // per Service, the last churn step the API server took
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; ; r++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-churn", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(110+i, r%7, 1+r%3))); err == nil {
					applied[i] = r
				}
				time.Sleep(30 * time.Millisecond) // pacing of the load, not synchronisation
			}
		}()
	}
	time.Sleep(time.Second)
	must(t, d.Kill())
	time.Sleep(time.Second) // churn goes on while fleetsync is down
	must(t, d.Restart(e.ctx, true))
	must(t, d.WaitReady(e.ctx, 30*time.Second))
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	for i, name := range names {
		exp := append(fixture.IPs(100+i, 0, 2), fixture.IPs(110+i, applied[i]%7, 1+applied[i]%3)...)
		var ks []string
		for _, ep := range exp {
			ks = append(ks, ep.IP+":80=passing")
		}
		e.waitInstancesWithin(name, strings.Join(slices.Sorted(slices.Values(ks)), ","), 15*time.Second)
	}
	lost, foreign := g.finish()
	// Writes during churn are all real changes: report lost/foreign only.
	t.Logf("FIGURES %s: lost=%d foreign=%d wasted=n/a (every write followed a real change)", t.Name(), lost, foreign)
	if lost != 0 || foreign != 0 {
		t.Errorf("lost=%d foreign=%d, want 0", lost, foreign)
	}
}

// TestAPIServerRestartLosesNothing: kube-apiserver restarts (watches break,
// informers relist); no live instance is deregistered, nothing is written,
// and changes made after it are synced.
func TestAPIServerRestartLosesNothing(t *testing.T) {
	e := newEnv(t)
	names, keys := svcSet(t, e, "relist", 5, 3, 120)
	e.daemon()
	e.waitCount(consul.Client, len(keys), 15*time.Second)
	g := newGuard(t, consul.Client, e.node(), names, keys)
	before := catalogTxns(t)
	must(t, kube.RestartAPIServer(e.ctx))
	time.Sleep(3 * time.Second) // informers reconnect and relist meanwhile
	writes := catalogTxns(t) - before
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[0], "after", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(130, 0, 1))))
	e.waitCount(consul.Client, len(keys)+1, 30*time.Second)
	lost, foreign := g.finish()
	figures(t, lost, foreign, writes, 0)
}

// TestChangeAfterAnAPIServerOutageIsPrompt: kube-apiserver stays away for
// 20 s, then comes back; a change made once it answers reaches Consul within
// a few seconds. client-go's reflector alone backs off 800 ms doubling to
// 30 s (jitter 1.0) while its watch is refused, so its next try came up to
// ~25 s after the API server was back (the soak's open finding); k8s.Patient
// retries at most a second apart instead.
func TestChangeAfterAnAPIServerOutageIsPrompt(t *testing.T) {
	e := newEnv(t)
	names, keys := svcSet(t, e, "outage", 2, 2, 140)
	e.daemon()
	e.waitCount(consul.Client, len(keys), 15*time.Second)
	must(t, kube.StopAPIServer())
	// The fault itself: an outage long enough for the reflector's backoff
	// to reach its 6.4-12.8 s step; nothing is awaited here.
	time.Sleep(20 * time.Second)
	must(t, kube.StartAPIServer(e.ctx))
	back := time.Now()
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[1], "after-outage", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(150, 0, 1))))
	e.waitCount(consul.Client, len(keys)+1, 60*time.Second)
	took := time.Since(back)
	t.Logf("FIGURES %s: change after a 20 s API server outage in Consul %v after /readyz", t.Name(), took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the change reached Consul %v after the API server was back, want < 5 s", took.Round(time.Millisecond))
	}
}

// TestDuplicateClusterIDIsRefused: a fleetsync of another Kubernetes cluster
// (a second API server) with the same cluster id refuses to start and names
// both clusters; a second replica of the same cluster starts fine.
func TestDuplicateClusterIDIsRefused(t *testing.T) {
	e := newEnv(t)
	e.daemon()
	replica := e.daemonFor(e.cluster, []string{e.ns})
	if replica.Exited() {
		t.Fatal("second replica of the same cluster exited")
	}
	other, err := stack.StartKube(e.ctx, stack.KubeOptions{})
	must(t, err)
	t.Cleanup(func() { _ = other.Stop() })
	d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: other.KubeconfigPath,
		ConsulAddr: consul.Addr, Namespaces: []string{e.ns}, Name: "fleetsync-impostor"})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })
	werr := d.Wait()
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("impostor exit: %v, want exit code 1", werr)
	}
	logTail := d.LogTail(5)
	t.Logf("impostor refused:\n%s", logTail)
	for _, s := range []string{"claimed", e.cluster, "--takeover-cluster-id"} {
		if !strings.Contains(logTail, s) {
			t.Errorf("refusal does not mention %q", s)
		}
	}
}

// TestRenamedInstanceIsRepaired: one of our instances re-registered in
// place under another Consul name (same ID, same node, our mark kept)
// leaves our name's index where it was; the periodic pass still sees it
// through the node's index and moves the instance back.
func TestRenamedInstanceIsRepaired(t *testing.T) {
	e := newEnv(t)
	names, keys := svcSet(t, e, "rn", 2, 3, 41)
	d := e.daemon("--resync-period=2s")
	e.waitCount(consul.Client, len(keys), 15*time.Second)
	// Passes that read nothing come after one that read: wait for two.
	eventually(t, 20*time.Second, "two anti-entropy passes", func() error {
		_, body, err := d.Get(e.ctx, "/debug/workers/"+e.ns+"/"+names[0], "")
		if err != nil {
			return err
		}
		var st struct {
			Resyncs int `json:"antiEntropyPasses"`
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return err
		}
		if st.Resyncs < 2 {
			return fmt.Errorf("%d passes", st.Resyncs)
		}
		return nil
	})
	ins, err := fixture.Instances(consul.Client, names[0], e.node())
	must(t, err)
	moved := &consulapi.CatalogRegistration{Node: e.node(), Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: ins[0].ID, Service: "renamed-" + names[0], Address: ins[0].Address, Port: ins[0].Port, Tags: ins[0].Tags, Meta: ins[0].Meta}}
	_, err = consul.Client.Catalog().Register(moved, nil)
	must(t, err)
	start := time.Now()
	var want []string
	for _, k := range keys[:3] {
		want = append(want, strings.TrimPrefix(k, names[0]+"/")+"=passing")
	}
	e.waitInstancesWithin(names[0], strings.Join(want, ","), 15*time.Second)
	t.Logf("FIGURES %s: the renamed instance was back under %s %s after the rename (--resync-period=2s)", t.Name(), names[0], time.Since(start).Round(time.Millisecond))
	eventually(t, 10*time.Second, "the renamed entry gone", func() error {
		got, _, err := consul.Client.Health().Service("renamed-"+names[0], "", false, nil)
		if err != nil || len(got) != 0 {
			return fmt.Errorf("%d entries under the other name (%v)", len(got), err)
		}
		return nil
	})
}
