package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// statusJSON mirrors `fleetsync status -o json`.
type statusJSON struct {
	Consul   string `json:"consul"`
	Index    uint64 `json:"index"`
	Clusters []struct {
		ClusterID          string         `json:"cluster_id"`
		Node               string         `json:"node"`
		Services           int            `json:"services"`
		Instances          int            `json:"instances"`
		Passing            int            `json:"passing"`
		Foreign            int            `json:"foreign_entries"`
		LastWriteIndex     uint64         `json:"last_write_index"`
		InstancesByService map[string]int `json:"instances_by_service"`
		Claim              *struct {
			KubeUID string `json:"kubernetesClusterUID"`
			Holder  string `json:"holder"`
			Held    bool   `json:"held"`
		} `json:"claim"`
	} `json:"clusters"`
	Others []struct {
		Node    string `json:"node"`
		Entries int    `json:"entries"`
	} `json:"other_nodes"`
}

// catalogSnapshot is every service entry and check in Consul with its
// ModifyIndex, keyed "node/id" (checks "node/check:id").
func catalogSnapshot(t *testing.T, c *consulapi.Client) map[string]uint64 {
	t.Helper()
	nodes, _, err := c.Catalog().Nodes(nil)
	must(t, err)
	snap := map[string]uint64{}
	for _, n := range nodes {
		snap[n.Node] = n.ModifyIndex
		list, _, err := c.Catalog().NodeServiceList(n.Node, nil)
		must(t, err)
		if list != nil {
			for _, s := range list.Services {
				snap[n.Node+"/"+s.ID] = s.ModifyIndex
			}
		}
		checks, _, err := c.Health().Node(n.Node, nil)
		must(t, err)
		for _, hc := range checks {
			snap[n.Node+"/check:"+hc.CheckID] = hc.ModifyIndex
		}
	}
	return snap
}

// without drops the keys of node (or under node/ when prefix).
func without(snap map[string]uint64, node string) map[string]uint64 {
	out := maps.Clone(snap)
	for k := range out {
		if k == node || strings.HasPrefix(k, node+"/") {
			delete(out, k)
		}
	}
	return out
}

// diffSnapshots lists the keys that differ.
func diffSnapshots(a, b map[string]uint64) []string {
	var d []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			d = append(d, fmt.Sprintf("%s: %d -> %d (present %t)", k, v, w, ok))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, k+": new")
		}
	}
	slices.Sort(d)
	return d
}

// TestStatusAndPurge: two clusters' daemons share one Consul. status lists
// both; after X is gone, purge --cluster-id=X (dry run, then --yes) removes
// exactly X's instances, keeps X's node while an entry without X's mark is on
// it, then removes the node and X's released claim; nothing of Y, of another
// node or of consul-k8s's k8s-sync node changes, not even its ModifyIndex.
// While X's fleetsync runs (its claim is held), purge refuses.
func TestStatusAndPurge(t *testing.T) {
	needStack(t)
	consul := stack.ConsulT(t)
	bin, err := fixture.Build()
	must(t, err)
	ctx, c := t.Context(), kube.Client
	x, y := uniq("x"), uniq("y")
	nsX, nsY := uniq("ops-x"), uniq("ops-y")
	createNamespace(t, nsX)
	createNamespace(t, nsY)
	fleetsync := func(args ...string) cmdResult {
		return runCmd(t, bin, append(args, "--consul-address="+consul.Addr)...)
	}
	start := func(cluster, ns string) *fixture.Daemon {
		d, err := fixture.StartDaemon(ctx, fixture.DaemonConfig{ClusterID: cluster, Kubeconfig: kube.KubeconfigPath,
			ConsulAddr: consul.Addr, Namespaces: []string{ns}})
		must(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("fleetsync %s log tail:\n%s", cluster, d.LogTail(40))
			}
			d.CloseT(t)
		})
		return d
	}

	// Entries fleetsync never touches: consul-k8s's node, a hand-made
	// instance of the shared name on another node tagged like X, and an
	// unmarked entry on X's node.
	for _, r := range []*consulapi.CatalogRegistration{
		{Node: "k8s-sync", Address: "127.0.0.1", NodeMeta: map[string]string{"external-source": "kubernetes"},
			Service: &consulapi.AgentService{ID: "shared-abc123", Service: "shared", Address: "10.9.0.1", Port: 80, Tags: []string{"k8s"},
				Meta: map[string]string{"external-source": "kubernetes", "external-k8s-ns": nsX}}},
		{Node: "hand-node", Address: "127.0.0.9",
			Service: &consulapi.AgentService{ID: "shared-by-hand", Service: "shared", Address: "192.168.0.1", Port: 80, Tags: []string{x}}},
	} {
		_, err := consul.Client.Catalog().Register(r, nil)
		must(t, err)
	}

	dX := start(x, nsX)
	start(y, nsY)
	ports := map[string]int32{"http": 80}
	shared := map[string]string{"consul.hashicorp.com/service-sync": "true", "consul.hashicorp.com/service-name": "shared"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(nsX, "web", shared, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(nsX, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 3))))
	must(t, fixture.ApplyService(ctx, c, fixture.Service(nsX, "api", map[string]string{"consul.hashicorp.com/service-sync": "true"}, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(nsX, "api", "a", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(2, 0, 2))))
	must(t, fixture.ApplyService(ctx, c, fixture.Service(nsY, "web", shared, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(nsY, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(3, 0, 2))))
	// An unmarked entry on X's node once the node exists.
	waitCount := func(name, node string, n int) {
		eventually(t, 20*time.Second, fmt.Sprintf("%d instances of %s on %s", n, name, node), func() error {
			ins, err := fixture.Instances(consul.Client, name, node)
			if err == nil && len(ins) != n {
				err = fmt.Errorf("have %d: %s", len(ins), fixture.Keys(ins, true))
			}
			return err
		})
	}
	waitCount("shared", "k8s-"+x, 3)
	waitCount("api", "k8s-"+x, 2)
	waitCount("shared", "k8s-"+y, 2)
	_, err = consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: "k8s-" + x, Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: "unmarked", Service: "shared", Address: "192.168.0.2", Port: 80}}, nil)
	must(t, err)

	// status, JSON and table.
	r := fleetsync("status", "-o", "json")
	if r.code != 0 {
		t.Fatalf("status: exit %d: %s", r.code, r.stderr)
	}
	var st statusJSON
	must(t, json.Unmarshal([]byte(r.stdout), &st))
	if len(st.Clusters) != 2 || len(st.Others) != 1 || st.Others[0].Node != "k8s-sync" || st.Others[0].Entries != 1 {
		t.Fatalf("status: %s", r.stdout)
	}
	byID := map[string]int{}
	for i, cl := range st.Clusters {
		byID[cl.ClusterID] = i
	}
	cx, cy := st.Clusters[byID[x]], st.Clusters[byID[y]]
	if cx.Node != "k8s-"+x || cx.Services != 2 || cx.Instances != 5 || cx.Passing != 5 || cx.Foreign != 1 ||
		cx.InstancesByService["shared"] != 3 || cx.InstancesByService["api"] != 2 || cx.LastWriteIndex == 0 || cx.LastWriteIndex > st.Index {
		t.Errorf("status of %s: %+v (index %d)", x, cx, st.Index)
	}
	if cy.Node != "k8s-"+y || cy.Services != 1 || cy.Instances != 2 || cy.Foreign != 0 {
		t.Errorf("status of %s: %+v", y, cy)
	}
	for _, cl := range []string{x, y} {
		if c := st.Clusters[byID[cl]].Claim; c == nil || !c.Held || c.KubeUID == "" || c.Holder == "" {
			t.Errorf("claim of %s in status: %+v, want held by a running fleetsync", cl, c)
		}
	}
	r = fleetsync("status")
	for _, want := range []string{"CLUSTER", "LAST WRITE INDEX", x + " ", "k8s-" + y, "k8s-sync"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("status table lacks %q (exit %d):\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	t.Logf("fleetsync status:\n%s", r.stdout)

	// While X's fleetsync runs (it holds X's claim), purge refuses.
	before := catalogSnapshot(t, consul.Client)
	for _, args := range [][]string{{"purge", "--cluster-id=" + x}, {"purge", "--cluster-id=" + x, "--yes"}} {
		r = fleetsync(args...)
		if r.code != 1 || !strings.Contains(r.stderr, "claimed by a running fleetsync") {
			t.Errorf("%v while %s runs: exit %d, stderr %q; want a refusal", args, x, r.code, r.stderr)
		}
	}
	if d := diffSnapshots(before, catalogSnapshot(t, consul.Client)); len(d) > 0 {
		t.Fatalf("refused purge changed Consul: %v", d)
	}

	// X's cluster is gone for good.
	must(t, dX.Close())
	before = catalogSnapshot(t, consul.Client)

	// Dry run: says what it would do, changes nothing.
	r = fleetsync("purge", "--cluster-id="+x)
	t.Logf("fleetsync purge --cluster-id=%s:\n%s", x, r.stdout)
	for _, want := range []string{"Would deregister 5 instances of 2 services", "Would keep node k8s-" + x, "id unmarked", "Dry run: nothing changed"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("dry run output lacks %q (exit %d):\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	if d := diffSnapshots(before, catalogSnapshot(t, consul.Client)); len(d) > 0 {
		t.Fatalf("dry run changed Consul: %v", d)
	}

	// --yes: X's five instances go; the unmarked entry keeps the node.
	r = fleetsync("purge", "--cluster-id="+x, "--yes")
	t.Logf("fleetsync purge --cluster-id=%s --yes:\n%s", x, r.stdout)
	for _, want := range []string{"Deregistered 5 instances of 2 services", "Kept node k8s-" + x} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("purge output lacks %q (exit %d):\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	after := catalogSnapshot(t, consul.Client)
	if d := diffSnapshots(without(before, "k8s-"+x), without(after, "k8s-"+x)); len(d) > 0 {
		t.Errorf("purge of %s changed entries of others: %v", x, d)
	}
	list, _, err := consul.Client.Catalog().NodeServiceList("k8s-"+x, nil)
	must(t, err)
	if list == nil || len(list.Services) != 1 || list.Services[0].ID != "unmarked" || after["k8s-"+x+"/unmarked"] != before["k8s-"+x+"/unmarked"] {
		t.Errorf("node k8s-%s after purge: %+v, want only the untouched unmarked entry", x, list)
	}

	// Its owner removes the unmarked entry: the next purge removes the node.
	_, err = consul.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: "k8s-" + x, ServiceID: "unmarked"}, nil)
	must(t, err)
	before = catalogSnapshot(t, consul.Client)
	r = fleetsync("purge", "--cluster-id="+x, "--yes")
	for _, want := range []string{"Deregistered 0 instances", "Deregistered node k8s-" + x, "Removed claim fleetsync/clusters/" + x} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("second purge output lacks %q (exit %d):\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	after = catalogSnapshot(t, consul.Client)
	if _, ok := after["k8s-"+x]; ok {
		t.Errorf("node k8s-%s still there", x)
	}
	if d := diffSnapshots(without(before, "k8s-"+x), after); len(d) > 0 {
		t.Errorf("second purge changed entries of others: %v", d)
	}
	waitCount("shared", "k8s-"+y, 2)

	// Nothing left to purge; status shows Y alone.
	r = fleetsync("purge", "--cluster-id="+x, "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "has nothing to purge") {
		t.Errorf("purge of a purged cluster: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = fleetsync("status", "-o", "json")
	st = statusJSON{}
	must(t, json.Unmarshal([]byte(r.stdout), &st))
	if len(st.Clusters) != 1 || st.Clusters[0].ClusterID != y || st.Clusters[0].Instances != 2 {
		t.Errorf("status after purge: %s", r.stdout)
	}
}

// TestPurgeRefusesForeignNode: a node named k8s-<id> whose meta is not
// that cluster's mark is someone else's; purge touches nothing on it, even
// an entry that carries the id's mark.
func TestPurgeRefusesForeignNode(t *testing.T) {
	needStack(t)
	consul := stack.ConsulT(t)
	bin, err := fixture.Build()
	must(t, err)
	z := uniq("z")
	_, err = consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: "k8s-" + z, Address: "127.0.0.1",
		NodeMeta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "someone-else"},
		Service: &consulapi.AgentService{ID: "k8s_" + z + "_ns_web_10.0.0.1_80", Service: "web", Address: "10.0.0.1", Port: 80,
			Tags: []string{z}, Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": z}}}, nil)
	must(t, err)
	before := catalogSnapshot(t, consul.Client)
	for _, args := range [][]string{{"purge", "--cluster-id=" + z}, {"purge", "--cluster-id=" + z, "--yes"}} {
		r := runCmd(t, bin, append(args, "--consul-address="+consul.Addr)...)
		if r.code != 1 || !strings.Contains(r.stderr, "refusing to touch node k8s-"+z) {
			t.Errorf("%v: exit %d, stderr %q; want a refusal", args, r.code, r.stderr)
		}
	}
	// The agent's own node is left out: a fresh agent re-syncs it on its
	// own schedule.
	if d := diffSnapshots(without(before, consul.NodeName), without(catalogSnapshot(t, consul.Client), consul.NodeName)); len(d) > 0 {
		t.Errorf("refused purge changed Consul: %v", d)
	}
	// status does not count it as cluster z either (its meta names
	// another cluster): it is listed among the other nodes.
	r := runCmd(t, bin, "status", "-o", "json", "--consul-address="+consul.Addr)
	var st statusJSON
	must(t, json.Unmarshal([]byte(r.stdout), &st))
	if len(st.Clusters) != 0 || len(st.Others) != 1 || st.Others[0].Node != "k8s-"+z {
		t.Errorf("status: %s", r.stdout)
	}
}
