package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
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
	instanceOn(t, client, node, addr, name, name+"-1", port, status)
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
	d := e.daemonOn(own, append([]string{"--to-k8s", "--k8s-write-namespace=" + e.ns}, args...)...)
	for i, n := range names {
		e.waitSlices(n, fmt.Sprintf("%s-4-%d-0[IPv4:%d]: "+addr+"=true/true/false", n, port, port, i+1))
	}
	return d
}

// importService makes the import-mode Service name in e.ns, of Consul
// service consulName, with one port; it is deleted at cleanup (an import
// daemon of a later test reads every namespace).
func (e *env) importService(name, consulName, portName string, port int32) {
	e.t.Helper()
	must(e.t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, name, map[string]string{"fleetsync.io/consul-service": consulName}, map[string]int32{portName: port})))
	e.t.Cleanup(func() {
		if err := kube.Client.CoreV1().Services(e.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			e.t.Errorf("delete Service %s: %v", name, err)
		}
	})
}

// TestToK8sConsulDownThenEmpty: Consul unreachable: nothing is deleted.
// Consul back empty (a dev agent keeps nothing): the answer that drops
// every mirrored Service and the import-mode one is held for
// --to-k8s-deletion-grace; the
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
	// An import-mode Service of the first name: judged and held with the
	// mirrored ones.
	e.importService("imp", names[0], "http", 8080)
	d := e.mirrorOn(own, "10.81.0.%d", 8080, names, "--to-k8s-allow="+p+"-*", "--to-k8s-deletion-grace=10s", "--to-k8s-import")
	e.waitSlices("imp", "imp-4-8080-0[IPv4:8080]: 10.81.0.1=true/true/false")
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

// tokenOn makes a token on own for e's daemon: its own nodes, sessions
// and claim written, every node read, plus rules; setRules replaces the
// plus.
func (e *env) tokenOn(own *stack.Consul, rules string) (token string, setRules func(rules string)) {
	e.t.Helper()
	base := fmt.Sprintf(`
node "k8s-%[1]s" { policy = "write" }
node_prefix "k8s-%[1]s." { policy = "write" }
node_prefix "" { policy = "read" }
session_prefix "" { policy = "write" }
key_prefix "fleetsync/clusters/" { policy = "write" }
`, e.cluster)
	policy, _, err := own.Client.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: "to-k8s-" + e.cluster, Rules: base + rules}, nil)
	must(e.t, err)
	tok, _, err := own.Client.ACL().TokenCreate(&consulapi.ACLToken{Policies: []*consulapi.ACLTokenPolicyLink{{ID: policy.ID}}}, nil)
	must(e.t, err)
	return tok.SecretID, func(rules string) {
		e.t.Helper()
		_, _, err := own.Client.ACL().PolicyUpdate(&consulapi.ACLPolicy{ID: policy.ID, Name: policy.Name, Rules: base + rules}, nil)
		must(e.t, err)
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
	const read = `service_prefix "" { policy = "read" }`
	token, setRules := e.tokenOn(own, read)
	p := e.cluster + "r"
	names := []string{p + "-a", p + "-b", p + "-c"}
	for i, n := range names {
		vmOn(t, own.Client, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.82.0.%d", i+1), n, 9090, "passing")
	}
	d := e.mirrorOn(own, "10.82.0.%d", 9090, names, "--consul-token="+token, "--to-k8s-allow="+p+"-*", "--to-k8s-deletion-grace=2s")
	before := e.marked()

	setRules("")
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
	setRules(read)
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

// instanceOn registers instance id of name on node (address addr) in the
// Consul of client, with one check in status.
func instanceOn(t *testing.T, client *consulapi.Client, node, addr, name, id string, port int, status string) {
	t.Helper()
	_, err := client.Catalog().Register(&consulapi.CatalogRegistration{
		Node: node, Address: addr, SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: id, Service: name, Port: port},
		Checks:  consulapi.HealthChecks{{Node: node, CheckID: "check-" + id, Name: "check", Status: status, ServiceID: id}},
	}, nil)
	must(t, err)
}

// heldView is /debug/workers?direction=to-k8s as "service=held" for the
// workers of e.ns, sorted.
func (e *env) heldView(d *fixture.Daemon) string {
	e.t.Helper()
	code, body, err := d.Get(e.ctx, "/debug/workers?direction=to-k8s", "application/json")
	if err != nil || code != 200 {
		e.t.Fatalf("GET /debug/workers?direction=to-k8s: %d %v", code, err)
	}
	var rows []struct{ Namespace, Service, Held string }
	must(e.t, json.Unmarshal([]byte(body), &rows))
	var out []string
	for _, r := range rows {
		if r.Namespace == e.ns {
			out = append(out, r.Service+"="+r.Held)
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// TestToK8sHealthFilteredByACLs: the token loses node:read on one of the
// two nodes of a mirrored and of an imported Consul service. Consul's
// health answers leave that node's instances out (200, filtered by ACLs;
// the streaming backend of the blocking reads does not say so) while the
// catalog still lists both names: the endpoints on that node stay as last
// seen, those on the other node follow their checks; one Event per unit,
// /debug/workers says held. Read restored, the unfiltered answer is
// applied as it is (an instance deregistered meanwhile goes).
func TestToK8sHealthFilteredByACLs(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ACL: true, ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	const read = `service_prefix "" { policy = "read" }`
	p := e.cluster + "h"
	vm1, vm2 := p+"-vm1", p+"-vm2"
	token, setRules := e.tokenOn(own, read)
	web, db := p+"-web", e.cluster+"-db" // mirrored (--to-k8s-allow), imported
	register := func(node, addr, status string, only ...string) {
		for _, svc := range []string{web, db} {
			if len(only) == 0 || slices.Contains(only, svc) {
				instanceOn(t, own.Client, node, addr, svc, svc+"-"+node, map[string]int{web: 8080, db: 5432}[svc], status)
			}
		}
	}
	register(vm1, "10.84.0.1", "passing")
	register(vm2, "10.84.0.2", "passing")
	e.importService("db", db, "pg", 5432)
	d := e.daemonOn(own, "--consul-token="+token, "--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*", "--to-k8s-import")
	view := func(vm1, vm2 string) (string, string) {
		return fmt.Sprintf("%s-4-8080-0[IPv4:8080]: 10.84.0.1=%s 10.84.0.2=%s", web, vm1, vm2),
			fmt.Sprintf("db-4-5432-0[IPv4:5432]: 10.84.0.1=%s 10.84.0.2=%s", vm1, vm2)
	}
	const ready, notReady = "true/true/false", "false/false/false"
	w, i := view(ready, ready)
	e.waitSlices(web, w)
	e.waitSlices("db", i)
	before := e.marked()

	setRules(read + fmt.Sprintf(`
node %q { policy = "deny" }`, vm2))
	// A check change wakes the blocking reads; a read that was waiting
	// may answer once more with the token as it was: change again.
	n := 0
	eventually(t, 20*time.Second, "the filtered answers held", func() error {
		n++
		register(vm1, "10.84.0.1", []string{"critical", "warning"}[n%2])
		for _, svc := range []string{web, "db"} {
			if v, err := sliceView(e.ctx, t, e.ns, svc); err == nil && !strings.Contains(v, "10.84.0.2=") {
				t.Fatalf("the endpoint on the node the token cannot read was removed: %s", v)
			}
		}
		if s := d.LogTail(500); strings.Count(s, "filtered by ACLs drops mirrored instances") < 2 {
			return fmt.Errorf("not both units hold")
		}
		return nil
	})
	register(vm1, "10.84.0.1", "critical")
	w, i = view(notReady, ready)
	e.waitSlices(web, w) // vm1's instances followed their checks, vm2's stay
	e.waitSlices("db", i)
	if ch, want := e.changedSince(before), []string{"slice/" + web + "-4-8080-0", "slice/db-4-5432-0"}; !slices.Equal(ch, want) {
		t.Fatalf("while filtered: written %v, want only %v", ch, want)
	}
	if got, want := e.heldView(d), web+"=filtered-by-acls db=filtered-by-acls"; got != want {
		t.Errorf("/debug/workers held: %q, want %q", got, want)
	}
	if _, table, err := d.Get(e.ctx, "/debug/workers?direction=to-k8s", "text/plain"); err != nil ||
		!regexp.MustCompile(`(?m)^`+e.ns+` +db +`+db+` +import .* filtered-by-acls *$`).MatchString(table) {
		t.Errorf("/debug/workers table (%v): no HELD filtered-by-acls for db\n%s", err, table)
	}
	for _, svc := range []string{"db", web} {
		eventually(t, 10*time.Second, "ConsulFilteredByACLs event", func() error {
			evs, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=ConsulFilteredByACLs,involvedObject.name=" + svc})
			if err != nil || len(evs.Items) != 1 || evs.Items[0].Count > 1 {
				return fmt.Errorf("events of %s: %v (%v), want one", svc, evs, err)
			}
			return nil
		})
	}

	_, err = own.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: vm2, ServiceID: web + "-" + vm2}, nil)
	must(t, err)
	setRules(read)
	register(vm1, "10.84.0.1", "passing")
	e.waitSlices(web, fmt.Sprintf("%s-4-8080-0[IPv4:8080]: 10.84.0.1=%s", web, ready))
	_, i = view(ready, ready)
	e.waitSlices("db", i)
	if got, want := e.heldView(d), web+"= db="; got != want {
		t.Errorf("/debug/workers held after read restored: %q, want %q", got, want)
	}
}

// TestToK8sImportMassDrop: four import-mode Services; three of their
// Consul services vanish in one transaction (a snapshot restored, Consul
// rebuilt): the slices stay untouched for --to-k8s-deletion-grace; the
// services back within it, nothing has been written after it. Gone again
// and not back, the re-read after the grace deletes their slices.
func TestToK8sImportMassDrop(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "m"
	var svcs, names []string
	for _, s := range []string{"a", "b", "c", "d"} {
		svcs, names = append(svcs, "imp-"+s), append(names, p+"-"+s)
	}
	register := func() {
		for j, n := range names {
			vmInstance(t, fmt.Sprintf("%s-vm%d", p, j), fmt.Sprintf("10.85.0.%d", j+1), n, n+"-1", "", 7000, "passing")
		}
	}
	register()
	for j, s := range svcs {
		e.importService(s, names[j], "tcp", 7000)
	}
	const grace = 8 * time.Second
	d := e.daemon("--to-k8s-import", fmt.Sprintf("--to-k8s-deletion-grace=%s", grace))
	for j, s := range svcs {
		e.waitSlices(s, fmt.Sprintf("%s-4-7000-0[IPv4:7000]: 10.85.0.%d=true/true/false", s, j+1))
	}
	before := e.marked()
	drop := func() {
		var ops consulapi.TxnOps
		for j := range 3 {
			ops = append(ops, &consulapi.TxnOp{Node: &consulapi.NodeTxnOp{Verb: consulapi.NodeDelete, Node: consulapi.Node{Node: fmt.Sprintf("%s-vm%d", p, j)}}})
		}
		ok, resp, _, err := consul.Client.Txn().Txn(ops, nil)
		if err != nil || !ok {
			t.Fatalf("txn: %v %+v", err, resp)
		}
	}

	drop()
	eventually(t, 20*time.Second, "the guard holding the import units", func() error {
		if ch := e.changedSince(before); len(ch) != 0 {
			t.Fatalf("three of four import units dropped at once: written %v", ch)
		}
		if !strings.Contains(d.LogTail(500), "drops most mirrored Services; holding") {
			return fmt.Errorf("no hold in the log")
		}
		return nil
	})
	held := time.Now()
	time.Sleep(2 * time.Second) // the workers' empty health answers arrive meanwhile: nothing to await
	if ch := e.changedSince(before); len(ch) != 0 {
		t.Fatalf("within the grace period: written %v", ch)
	}
	register()
	time.Sleep(time.Until(held.Add(grace + 3*time.Second))) // past the grace period: the re-read must delete nothing
	if ch := e.changedSince(before); len(ch) != 0 {
		t.Fatalf("services back within the grace period: written %v", ch)
	}

	drop()
	for j, s := range svcs {
		want := ""
		if j == 3 {
			want = fmt.Sprintf("%s-4-7000-0[IPv4:7000]: 10.85.0.4=true/true/false", s)
		}
		eventually(t, grace+20*time.Second, "slices of "+s+" after the grace period", func() error {
			got, err := sliceView(e.ctx, t, e.ns, s)
			if err != nil || got != want {
				return fmt.Errorf("have %q (%v), want %q", got, err, want)
			}
			return nil
		})
	}
}
