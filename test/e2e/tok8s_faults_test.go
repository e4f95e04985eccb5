package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// vmOn registers one instance of name on its own node in the Consul of
// client, with one check in status.
func vmOn(t *testing.T, client *consulapi.Client, node, addr, name string, port int, status string) {
	t.Helper()
	_, err := client.Catalog().Register(&consulapi.CatalogRegistration{
		Node: node, Address: addr, SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: name + "-1", Service: name, Port: port},
		Checks:  consulapi.HealthChecks{{Node: node, CheckID: "check-" + name, Name: "check", Status: status, ServiceID: name + "-1"}},
	}, nil)
	must(t, err)
}

// marked is every to-k8s object of e.ns: "kind/name" -> "uid/resourceVersion".
// Two views that are equal mean nothing was written in between.
func (e *env) marked() map[string]string {
	e.t.Helper()
	sel := metav1.ListOptions{LabelSelector: "endpointslice.kubernetes.io/managed-by=to-k8s.fleetsync.io"}
	out := map[string]string{}
	svcs, err := kube.Client.CoreV1().Services(e.ns).List(e.ctx, sel)
	must(e.t, err)
	for _, s := range svcs.Items {
		out["svc/"+s.Name] = string(s.UID) + "/" + s.ResourceVersion
	}
	sl, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, sel)
	must(e.t, err)
	for _, s := range sl.Items {
		out["slice/"+s.Name] = string(s.UID) + "/" + s.ResourceVersion
	}
	return out
}

// changedSince lists the objects written (or gone, or new) since before.
func (e *env) changedSince(before map[string]string) []string {
	e.t.Helper()
	now := e.marked()
	var out []string
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if now[k] != before[k] {
			out = append(out, k)
		}
	}
	for k := range now {
		if _, ok := before[k]; !ok {
			out = append(out, k+" (new)")
		}
	}
	slices.Sort(out)
	return out
}

// mirrorOn starts fleetsync in mirror mode against own and waits until
// names[i] is mirrored with its one instance at fmt.Sprintf(addr, i+1):port.
func (e *env) mirrorOn(own *stack.Consul, addr string, port int, names []string, args ...string) *fixture.Daemon {
	e.t.Helper()
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Addr, Namespaces: []string{e.ns}, Args: append([]string{"--to-k8s", "--k8s-write-namespace=" + e.ns}, args...)})
	must(e.t, err)
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("fleetsync log tail:\n%s", d.LogTail(80))
		}
		d.CloseT(e.t)
	})
	for i, n := range names {
		e.waitSlices(n, fmt.Sprintf("%s-4-%d-0[IPv4:%d]: "+addr+"=true/true/false", n, port, port, i+1))
	}
	return d
}

// TestToK8sConsulDownThenEmpty: Consul unreachable: nothing is deleted.
// Consul back empty (a dev agent keeps nothing): the answer that drops
// every mirrored Service is held for --to-k8s-deletion-grace; the
// instances registered again meanwhile, one with a new state, cost exactly
// that one slice write, and nothing is deleted after the grace period.
func TestToK8sConsulDownThenEmpty(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	p := e.cluster + "d"
	names := []string{p + "-a", p + "-b", p + "-c", p + "-d"}
	register := func(lastStatus string) {
		for i, n := range names {
			status := "passing"
			if i == len(names)-1 {
				status = lastStatus
			}
			vmOn(t, own.Client, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.81.0.%d", i+1), n, 8080, status)
		}
	}
	register("passing")
	d := e.mirrorOn(own, "10.81.0.%d", 8080, names, "--to-k8s-allow="+p+"-*", "--to-k8s-deletion-grace=10s")
	before := e.marked()

	must(t, own.Kill())
	time.Sleep(3 * time.Second) // Consul away: every watch fails meanwhile; nothing to await
	if ch := e.changedSince(before); len(ch) != 0 {
		t.Fatalf("Consul unreachable: written %v", ch)
	}

	must(t, own.Restart(e.ctx))
	eventually(t, 20*time.Second, "the guard holding the mass drop", func() error {
		if !strings.Contains(d.LogTail(500), "drops most mirrored Services; holding") {
			return fmt.Errorf("no hold in the log")
		}
		return nil
	})
	if ch := e.changedSince(before); len(ch) != 0 {
		t.Fatalf("Consul restarted empty, within the grace period: written %v", ch)
	}
	last := names[len(names)-1]
	register("critical") // the VMs' agents register again; one instance turned critical meanwhile
	e.waitSlices(last, last+"-4-8080-0[IPv4:8080]: 10.81.0.4=false/false/false")
	time.Sleep(12 * time.Second) // past the grace period: the guard's re-read must delete nothing
	if ch, want := e.changedSince(before), []string{"slice/" + last + "-4-8080-0"}; !slices.Equal(ch, want) {
		t.Fatalf("after Consul restarted empty: written %v, want only %v", ch, want)
	}
}

// TestToK8sTokenLosesRead: the token loses service:read; Consul's answers
// come back filtered (no names, no instances) and the guard holds every
// mirrored Service for as long as that lasts, well past the grace period;
// read restored, nothing has been written.
func TestToK8sTokenLosesRead(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ACL: true, ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	base := fmt.Sprintf(`
node "k8s-%[1]s" { policy = "write" }
node_prefix "k8s-%[1]s." { policy = "write" }
node_prefix "" { policy = "read" }
session_prefix "" { policy = "write" }
key_prefix "fleetsync/clusters/" { policy = "write" }
`, e.cluster)
	const read = `service_prefix "" { policy = "read" }`
	policy, _, err := own.Client.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: "to-k8s-" + e.cluster, Rules: base + read}, nil)
	must(t, err)
	tok, _, err := own.Client.ACL().TokenCreate(&consulapi.ACLToken{Policies: []*consulapi.ACLTokenPolicyLink{{ID: policy.ID}}}, nil)
	must(t, err)
	p := e.cluster + "r"
	names := []string{p + "-a", p + "-b", p + "-c"}
	for i, n := range names {
		vmOn(t, own.Client, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.82.0.%d", i+1), n, 9090, "passing")
	}
	d := e.mirrorOn(own, "10.82.0.%d", 9090, names, "--consul-token="+tok.SecretID, "--to-k8s-allow="+p+"-*", "--to-k8s-deletion-grace=2s")
	before := e.marked()

	_, _, err = own.Client.ACL().PolicyUpdate(&consulapi.ACLPolicy{ID: policy.ID, Name: policy.Name, Rules: base}, nil)
	must(t, err)
	// Changes in Consul wake the blocking queries: the catalog's (names
	// outside the mirrored ones) and one mirrored service's health. A
	// query that was waiting answers once more with the token as it was
	// when it began; the next ones are filtered.
	n := 0
	eventually(t, 20*time.Second, "the guard holding a filtered answer", func() error {
		n++
		vmOn(t, own.Client, p+"-other", "10.82.1.1", fmt.Sprintf("other%d-%s", n, p), 9090, "passing")
		vmOn(t, own.Client, p+"-vm0", "10.82.0.1", names[0], 9090, []string{"warning", "passing"}[n%2])
		if !strings.Contains(d.LogTail(500), "filtered by ACLs drops most mirrored Services") {
			return fmt.Errorf("no hold in the log")
		}
		return nil
	})
	time.Sleep(5 * time.Second) // past the 2 s grace period: nothing may be deleted
	if ch := e.changedSince(before); len(ch) != 0 {
		t.Fatalf("token without service:read: written %v", ch)
	}
	_, _, err = own.Client.ACL().PolicyUpdate(&consulapi.ACLPolicy{ID: policy.ID, Name: policy.Name, Rules: base + read}, nil)
	must(t, err)
	vmOn(t, own.Client, p+"-vm0", "10.82.0.1", names[0], 9090, "passing")
	time.Sleep(3 * time.Second) // read restored; the state is as it was: nothing to write
	if ch := e.changedSince(before); len(ch) != 0 {
		t.Fatalf("read restored: written %v", ch)
	}
}

// TestToK8sAPIServerRestart: kube-apiserver restarts (watches break, the
// informers of marked objects relist): nothing is written.
func TestToK8sAPIServerRestart(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "k"
	names := []string{p + "-a", p + "-b", p + "-c"}
	for i, n := range names {
		vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.83.0.%d", i+1), n, n+"-1", "", 7070, "passing")
	}
	e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*")
	for i, n := range names {
		e.waitSlices(n, fmt.Sprintf("%s-4-7070-0[IPv4:7070]: 10.83.0.%d=true/true/false", n, i+1))
	}
	before := e.marked()
	must(t, kube.RestartAPIServer(e.ctx))
	time.Sleep(5 * time.Second) // informers reconnect and relist meanwhile
	if ch := e.changedSince(before); len(ch) != 0 {
		t.Fatalf("kube-apiserver restart: written %v", ch)
	}
	// Still in sync afterwards: a change lands.
	vmInstance(t, p+"-vm0", "10.83.0.1", names[0], names[0]+"-1", "", 7070, "critical")
	e.waitSlices(names[0], names[0]+"-4-7070-0[IPv4:7070]: 10.83.0.1=false/false/false")
}

// TestToK8sFilteredOut: with --to-k8s-filter, an instance that stops
// matching leaves an empty health answer while its name stays in the
// catalog: the mirrored Service goes (no deletion guard holds it: Consul
// cannot tell "filtered out" from "gone" in a filtered read).
func TestToK8sFilteredOut(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "f"
	web := p + "-web"
	taggedInstance(t, p+"-vm1", "10.87.0.1", web, "f1", 80, nil, map[string]string{"env": "prod"})
	e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*", `--to-k8s-filter=Service.Meta.env == "prod"`)
	e.waitSlices(web, web+"-4-80-0[IPv4:80]: 10.87.0.1=true/true/false")
	taggedInstance(t, p+"-vm1", "10.87.0.1", web, "f1", 80, nil, map[string]string{"env": "dev"})
	eventually(t, 20*time.Second, "mirrored Service deleted", func() error {
		if _, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, web, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("service %s still there", web)
		}
		if s, _ := sliceView(e.ctx, t, e.ns, web); s != "" {
			return fmt.Errorf("slices left: %s", s)
		}
		return nil
	})
}
