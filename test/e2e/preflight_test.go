package e2e

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// registerConsulK8s writes what consul-k8s v1.6's catalog sync registers
// for a ClusterIP Service's ready endpoint (control-plane/catalog/to-consul/
// resource.go, generateRegistrations and registerServiceInstance): on its
// node, the instance with consul-k8s's ID, tag, meta and port-<name> keys,
// and its readiness check.
func registerConsulK8s(t *testing.T, node, ns, name, addr string, port int, ports map[string]int32, pod string) {
	t.Helper()
	sum := sha1.Sum([]byte(fmt.Sprintf("%s-%s", name, addr)))
	id := name + "-" + hex.EncodeToString(sum[:])[:12]
	meta := map[string]string{"external-source": "kubernetes", "external-k8s-ns": ns,
		"external-k8s-ref-kind": "Pod", "external-k8s-ref-name": pod}
	for n, p := range ports {
		meta["port-"+n] = fmt.Sprint(p)
	}
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{
		Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
		NodeMeta: map[string]string{"external-source": "kubernetes"},
		Service:  &consulapi.AgentService{ID: id, Service: name, Address: addr, Port: port, Tags: []string{"k8s"}, Meta: meta},
		Check: &consulapi.AgentCheck{CheckID: ns + "/" + id, Name: "Kubernetes Readiness Check", Type: "kubernetes-readiness",
			ServiceID: id, Status: consulapi.HealthPassing, Output: "Kubernetes health checks passing"},
	}, nil)
	must(t, err)
}

// preflightOut mirrors `fleetsync preflight -o json`.
type preflightOut struct {
	Services []struct {
		Namespace, Service, Verdict, Reason string
		Name                                string   `json:"consul_name"`
		Missing                             []string `json:"missing"`
		Differences                         []string `json:"differences"`
	} `json:"services"`
	Settings     []string `json:"settings"`
	Disappearing int      `json:"disappearing"`
}

// TestPreflight: consul-k8s's registrations, in its exact shape, on its
// own node; `fleetsync preflight` against the real stack says per Service
// what the switch would change: web the same instances with other tags,
// meta and check; legacy (not annotated, synced by consul-k8s's default)
// gone with the reason and the setting to change, so it exits 1; fresh new.
// With --default-sync=true nothing disappears and it exits 0.
func TestPreflight(t *testing.T) {
	e := newEnv(t)
	node := "k8s-sync-" + e.cluster
	ports := map[string]int32{"http": 80}
	mk := func(name string, ann map[string]string, base int) {
		must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, name, ann, ports)))
		must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(base, 0, 2))))
	}
	mk("web", map[string]string{optIn: "true"}, 180)
	mk("legacy", map[string]string{}, 181)
	mk("fresh", map[string]string{optIn: "true"}, 182)
	for i, name := range []string{"web", "legacy"} {
		for j, ep := range fixture.IPs(180+i, 0, 2) {
			registerConsulK8s(t, node, e.ns, name, ep.IP, 80, ports, fmt.Sprintf("%s-%d", name, j))
		}
	}
	t.Cleanup(func() { _, _ = consul.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: node}, nil) })
	bin, err := fixture.Build()
	must(t, err)
	run := func(args ...string) (string, int) {
		cmd := exec.CommandContext(e.ctx, bin, append([]string{"preflight", "--cluster-id=" + e.cluster, "--kubeconfig=" + kube.KubeconfigPath,
			"--consul-address=" + consul.Addr, "--consul-k8s-node-name=" + node, "--allow-namespace=" + e.ns}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code > 1 || stderr.Len() > 0 {
			t.Fatalf("preflight %v: exit %d: %s", args, code, stderr.String())
		}
		return string(out), code
	}

	table, code := run()
	t.Logf("fleetsync preflight (exit %d):\n%s", code, table)
	if code != 1 || !strings.Contains(table, "1 Services would lose instances") {
		t.Errorf("table: exit %d, want 1 and the count", code)
	}
	js, code := run("-o", "json")
	var rep preflightOut
	must(t, json.Unmarshal([]byte(js), &rep))
	got := map[string]string{}
	for _, s := range rep.Services {
		got[s.Name] = s.Verdict
		switch s.Name {
		case "web":
			diffs := strings.Join(s.Differences, "; ")
			for _, want := range []string{"tags added: " + e.cluster, "meta keys dropped: external-k8s-ns, external-k8s-ref-kind, external-k8s-ref-name, port-http (--consul-k8s-meta", `check "kubernetes-readiness" instead of "Kubernetes Readiness Check"`} {
				if !strings.Contains(diffs, want) {
					t.Errorf("web differences %q lack %q", diffs, want)
				}
			}
		case "legacy":
			if s.Service != "legacy" || len(s.Missing) != 2 || !strings.Contains(s.Reason, "--default-sync=false") {
				t.Errorf("legacy: %+v", s)
			}
		}
	}
	if code != 1 || rep.Disappearing != 1 || got["web"] != "changes" || got["legacy"] != "disappears" || got["fresh"] != "new" ||
		len(rep.Settings) != 1 || !strings.Contains(rep.Settings[0], "--default-sync=true") {
		t.Errorf("json: exit %d, verdicts %v, settings %q, %d disappearing", code, got, rep.Settings, rep.Disappearing)
	}

	out, code := run("--default-sync=true")
	if code != 0 || !strings.Contains(out, "Nothing consul-k8s registered would disappear") {
		t.Errorf("with --default-sync=true: exit %d:\n%s", code, out)
	}
}
