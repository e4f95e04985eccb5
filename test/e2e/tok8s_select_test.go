package e2e

import (
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// taggedInstance registers one passing instance of name on its own node
// with tags and meta.
func taggedInstance(t *testing.T, node, addr, name, id string, port int, tags []string, meta map[string]string) {
	t.Helper()
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{
		Node: node, Address: addr, SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: id, Service: name, Port: port, Tags: tags, Meta: meta},
		Checks:  consulapi.HealthChecks{{Node: node, CheckID: "check-" + id, Name: "check", Status: "passing", ServiceID: id}},
	}, nil)
	must(t, err)
}

// waitEvent waits for an Event of reason on object name whose message
// contains want.
func (e *env) waitEvent(reason, name, want string) {
	e.t.Helper()
	eventually(e.t, 10*time.Second, reason+" event for "+name, func() error {
		evs, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=" + reason + ",involvedObject.name=" + name})
		if err != nil {
			return err
		}
		var msgs []string
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, want) {
				return nil
			}
			msgs = append(msgs, ev.Message)
		}
		return fmt.Errorf("no event containing %q (have %q)", want, msgs)
	})
}

// TestToK8sSelect: which instances, on the real agent. Import mode's
// optional annotations (consul-tag, consul-filter, consul-datacenter) are
// passed to Consul and narrow the slices; changing one re-reads; a bad
// one is an InvalidAnnotation Event naming it and no slices. Mirror
// mode's --to-k8s-require-tag leaves out untagged instances and names
// with no tagged instance, --to-k8s-filter the instances it does not
// select.
func TestToK8sSelect(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "s"
	self, err := consul.Client.Agent().Self()
	must(t, err)
	dc, _ := self["Config"]["Datacenter"].(string)
	pg := p + "-pg"
	taggedInstance(t, p+"-vm1", "10.81.0.1", pg, "pg1", 5432, []string{"primary"}, map[string]string{"env": "prod"})
	taggedInstance(t, p+"-vm2", "10.81.0.2", pg, "pg2", 5432, nil, map[string]string{"env": "prod"})
	taggedInstance(t, p+"-vm3", "10.81.0.3", pg, "pg3", 5432, []string{"primary"}, map[string]string{"env": "dev"})
	mA, mB := p+"-m-a", p+"-m-b"
	taggedInstance(t, p+"-vm4", "10.81.0.4", mA, "a1", 80, []string{"mirror"}, map[string]string{"env": "prod"})
	taggedInstance(t, p+"-vm5", "10.81.0.5", mA, "a2", 80, nil, map[string]string{"env": "prod"})
	taggedInstance(t, p+"-vm6", "10.81.0.6", mA, "a3", 80, []string{"mirror"}, map[string]string{"env": "dev"})
	taggedInstance(t, p+"-vm7", "10.81.0.7", mB, "b1", 80, nil, map[string]string{"env": "prod"})

	ports := map[string]int32{"pg": 5432}
	imp := func(name string, kv ...string) {
		ann := map[string]string{"fleetsync.io/consul-service": pg}
		for i := 0; i+1 < len(kv); i += 2 {
			ann[kv[i]] = kv[i+1]
		}
		must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, name, ann, ports)))
	}
	imp("by-tag", "fleetsync.io/consul-tag", "primary")
	imp("by-filter", "fleetsync.io/consul-filter", `Service.Meta.env == "prod"`)
	imp("by-all", "fleetsync.io/consul-datacenter", dc, "fleetsync.io/consul-tag", "primary", "fleetsync.io/consul-filter", `Service.Meta.env == "prod"`, "fleetsync.io/window", "0s")
	imp("bad-dc", "fleetsync.io/consul-datacenter", "No Such DC")
	imp("bad-filter", "fleetsync.io/consul-filter", `Service.Meta.env ==`)
	imp("bad-window", "fleetsync.io/window", "soon")

	d := e.daemon("--to-k8s-import", "--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-m-*",
		"--to-k8s-require-tag=mirror", `--to-k8s-filter=Service.Meta.env == "prod"`)
	e.waitSlices("by-tag", "by-tag-4-5432-0[IPv4:5432]: 10.81.0.1=true/true/false 10.81.0.3=true/true/false")
	e.waitSlices("by-filter", "by-filter-4-5432-0[IPv4:5432]: 10.81.0.1=true/true/false 10.81.0.2=true/true/false")
	e.waitSlices("by-all", "by-all-4-5432-0[IPv4:5432]: 10.81.0.1=true/true/false")
	e.waitSlices(mA, mA+"-4-80-0[IPv4:80]: 10.81.0.4=true/true/false")
	e.waitEvent("InvalidAnnotation", "bad-dc", `fleetsync.io/consul-datacenter="No Such DC"`)
	e.waitEvent("InvalidAnnotation", "bad-filter", `fleetsync.io/consul-filter="Service.Meta.env =="`)
	e.waitEvent("InvalidAnnotation", "bad-window", `fleetsync.io/window="soon"`)
	for _, name := range []string{"bad-dc", "bad-filter", "bad-window", mB} {
		if s, _ := sliceView(e.ctx, t, e.ns, name); s != "" {
			t.Errorf("slices for %s: %s", name, s)
		}
	}
	if _, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, mB, metav1.GetOptions{}); err == nil {
		t.Errorf("%s (no instance with the required tag) was mirrored", mB)
	}
	e.quiet("steady state with narrowed reads", 2*time.Second)

	// Another tag: the unit reads again with the new query.
	imp("by-tag", "fleetsync.io/consul-tag", "primary", "fleetsync.io/consul-filter", `Service.Meta.env == "dev"`)
	e.waitSlices("by-tag", "by-tag-4-5432-0[IPv4:5432]: 10.81.0.3=true/true/false")
	// The instance gains the required tag: mirrored.
	taggedInstance(t, p+"-vm7", "10.81.0.7", mB, "b1", 80, []string{"mirror"}, map[string]string{"env": "prod"})
	e.waitSlices(mB, mB+"-4-80-0[IPv4:80]: 10.81.0.7=true/true/false")

	e.operateToK8s(d, mA, mB)
}

// operateToK8s checks the operator's view of a running to-k8s fleet
// (TestToK8sSelect's): /debug/workers?direction=to-k8s, the per-worker
// metrics and status --to-k8s, which lists the mirrored and imported
// Services. purge --to-k8s, while the daemon runs (it holds the cluster
// id's claim): the dry run lists and says --yes is refused, --yes is
// refused and deletes nothing, --yes --wait-released waits, deleting
// nothing, and once the daemon stopped deletes exactly this cluster's
// marked objects: never the user's import-mode Services, nor another
// cluster's marked objects.
func (e *env) operateToK8s(d *fixture.Daemon, mA, mB string) {
	t := e.t
	code, body, err := d.Get(e.ctx, "/debug/workers?direction=to-k8s", "text/plain")
	if err != nil || code != 200 || !regexp.MustCompile(`(?m)^`+e.ns+` +by-all +\S+-pg +import +1 +1 +1 +0 `).MatchString(body) ||
		!regexp.MustCompile(`(?m)^`+e.ns+` +`+mA+` +`+mA+` +mirror +1 +2 `).MatchString(body) {
		t.Errorf("GET /debug/workers?direction=to-k8s: %d %v\n%s", code, err, body)
	}
	code, body, err = d.Get(e.ctx, "/metrics", "")
	if err != nil || code != 200 || !strings.Contains(body, `fleetsync_tok8s_worker_endpoints{namespace="`+e.ns+`",service="by-filter"} 2`) ||
		!strings.Contains(body, `fleetsync_tok8s_workers 5`) {
		t.Errorf("GET /metrics: %d %v: no to-k8s series of by-filter, or not 5 workers", code, err)
	}
	// Another cluster's mirror in the same namespace: never this cluster's to purge.
	other := fixture.Service(e.ns, "other-mirror", nil, map[string]int32{"http": 80})
	other.Labels = map[string]string{"endpointslice.kubernetes.io/managed-by": "to-k8s.fleetsync.io", "fleetsync.io/cluster": "zz" + e.cluster}
	must(t, fixture.ApplyService(e.ctx, kube.Client, other))

	bin, err := fixture.Build()
	must(t, err)
	command := func(args ...string) *exec.Cmd {
		return exec.CommandContext(e.ctx, bin, append(args, "--consul-address="+consul.Addr, "--kubeconfig="+kube.KubeconfigPath)...)
	}
	cli := func(args ...string) string {
		t.Helper()
		out, err := command(args...).CombinedOutput()
		if err != nil {
			t.Fatalf("fleetsync %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := cli("status", "--to-k8s")
	for _, want := range []string{e.cluster + " +" + e.ns + " +by-tag +\\S+-pg +import +1 +1 +1", e.cluster + " +" + e.ns + " +" + mB + " +" + mB + " +mirror +1 +1 +1", "zz" + e.cluster + " +" + e.ns + " +other-mirror +- +mirror +0"} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("status --to-k8s lacks %q:\n%s", want, out)
		}
	}
	writes := e.k8sWrites()
	refusal := "refusing: cluster id " + e.cluster + " is claimed by a running fleetsync"
	out = cli("purge", "--to-k8s", "--cluster-id="+e.cluster)
	t.Logf("purge --to-k8s, the daemon running:\n%s", out)
	if !strings.Contains(out, "Would delete 7 Kubernetes objects") || !strings.Contains(out, "With --yes now: "+refusal) {
		t.Errorf("dry run, the daemon running:\n%s", out)
	}
	refused, err := command("purge", "--to-k8s", "--cluster-id="+e.cluster, "--yes").CombinedOutput()
	if err == nil || !strings.Contains(string(refused), "fleetsync purge --to-k8s: "+refusal) {
		t.Errorf("purge --to-k8s --yes, the daemon running: %v\n%s", err, refused)
	}

	// --wait-released: waits while the daemon runs, deletes once it stopped.
	purge, err := fixture.StartCommand(command("purge", "--to-k8s", "--cluster-id="+e.cluster, "--yes", "--wait-released=1m"))
	must(t, err)
	if !purge.WaitLine("Waiting up to 1m0s for the fleetsync holding cluster id " + e.cluster) {
		t.Errorf("purge --to-k8s --yes --wait-released did not wait:\n%s", purge.Output())
	}
	if n := writes.Load(); n != 0 {
		t.Errorf("%d Kubernetes writes while the daemon ran: purge --to-k8s deleted", n)
	}
	must(t, d.Stop())
	out, err = purge.Wait()
	t.Logf("purge --to-k8s --yes --wait-released:\n%s", out)
	if err != nil || !strings.Contains(out, "Deleted 7 of 7 objects.") {
		t.Errorf("purge --to-k8s --yes --wait-released: %v", err)
	}
	svcs, err := kube.Client.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
	must(t, err)
	var left []string
	for _, s := range svcs.Items {
		left = append(left, s.Name)
	}
	slices, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: "endpointslice.kubernetes.io/managed-by=to-k8s.fleetsync.io"})
	must(t, err)
	sort.Strings(left)
	if got := strings.Join(left, ","); got != "bad-dc,bad-filter,bad-window,by-all,by-filter,by-tag,other-mirror" || len(slices.Items) != 0 {
		t.Errorf("after purge: Services %s, %d marked slices; want the user's and the other cluster's, no slice", got, len(slices.Items))
	}
}
