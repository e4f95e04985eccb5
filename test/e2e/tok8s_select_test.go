package e2e

import (
	"fmt"
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

	e.daemon("--to-k8s-import", "--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-m-*",
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
}
