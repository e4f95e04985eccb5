package deploy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestChartRBACIsSufficient creates the chart's ServiceAccount, ClusterRole
// and ClusterRoleBinding in the real API server, mints a token for the
// ServiceAccount (TokenRequest), and runs fleetsync with only that token: a
// Service syncs into Consul, a bad one gets its Events (created, then
// patched when repeated), and nothing in the log was forbidden. The
// ServiceAccount may do exactly what the daemon needs, and no more.
func TestChartRBACIsSufficient(t *testing.T) {
	needStack(t)
	consul := stack.ConsulT(t)
	ctx, c := t.Context(), kube.Client
	rel, ns, appNS, cluster := uniq("rbac"), uniq("fleetsync-rbac"), uniq("app"), uniq("rbac")
	createNamespace(t, ns)
	createNamespace(t, appNS)

	_, sa := installChartRBAC(t, chartProfiles[0], rel, ns)
	checkAccess(t, ns, sa, appNS, false)
	kubeconfig := saKubeconfig(t, ns, sa)

	d, err := fixture.StartDaemon(ctx, fixture.DaemonConfig{ClusterID: cluster, Kubeconfig: kubeconfig, ConsulAddr: consul.Addr,
		Namespaces: []string{appNS}, Name: "fleetsync-rbac", Args: []string{"--enable-ingress"}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(60))
		}
		d.CloseT(t)
	})

	syncWeb(t, ctx, c, consul, appNS, cluster)

	// A bad annotation is reported as an Event (create); made good and
	// bad again, the same Event is reported again (patch: count 2).
	bad := map[string]string{"consul.hashicorp.com/service-sync": "true", "consul.hashicorp.com/service-port": "70000"}
	good := map[string]string{"consul.hashicorp.com/service-sync": "true", "consul.hashicorp.com/service-port": "http"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "bad", bad, webPorts)))
	waitEventCount(t, appNS, "bad", 1)
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "bad", good, webPorts)))
	eventually(t, 20*time.Second, "worker of the fixed Service valid again", func() error {
		code, body, err := d.Get(ctx, "/debug/workers/"+appNS+"/bad", "")
		if err == nil && (code != 200 || strings.Contains(body, `"state": "invalid"`)) {
			err = fmt.Errorf("%d %s", code, body)
		}
		return err
	})
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "bad", bad, webPorts)))
	waitEventCount(t, appNS, "bad", 2)

	log, err := os.ReadFile(d.LogPath)
	must(t, err)
	if m := regexp.MustCompile(`(?i).*forbidden.*`).Find(log); m != nil {
		t.Errorf("fleetsync was forbidden something: %s", m)
	}
}

// TestChartShardedRBACIsSufficient is TestChartRBACIsSufficient for a
// sharded install: with the chart's ServiceAccount, ClusterRole and Lease
// Role, two daemons (replicas a and b, --shards=4, the Leases in the
// release namespace as the chart's Deployment says) split the four shards
// between them, a Service syncs into Consul from the one replica that holds
// its shard, both stop on SIGTERM deleting their replica Leases, and
// neither was ever forbidden anything.
func TestChartShardedRBACIsSufficient(t *testing.T) {
	needStack(t)
	consul := stack.ConsulT(t)
	ctx, c := t.Context(), kube.Client
	rel, ns, appNS, cluster := uniq("rbac-sharded"), uniq("fleetsync-sharded"), uniq("app"), uniq("sharded")
	createNamespace(t, ns)
	createNamespace(t, appNS)

	o, sa := installChartRBAC(t, profile(t, "sharded"), rel, ns)
	var dep appsv1.Deployment
	o.one(t, "Deployment", &dep)
	leaseNS := "--lease-namespace=" + ns
	if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, leaseNS) {
		t.Fatalf("the chart's Deployment args %q lack %s", args, leaseNS)
	}
	checkAccess(t, ns, sa, appNS, true)
	kubeconfig := saKubeconfig(t, ns, sa)

	const shards = 4
	ids := []string{"a", "b"}
	daemons := map[string]*fixture.Daemon{}
	for _, id := range ids {
		d, err := fixture.StartDaemon(ctx, fixture.DaemonConfig{ClusterID: cluster, Kubeconfig: kubeconfig, ConsulAddr: consul.Addr,
			Namespaces: []string{appNS}, Name: "fleetsync-sharded-" + id,
			Args: []string{fmt.Sprintf("--shards=%d", shards), leaseNS, "--replica-id=" + id}})
		must(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("fleetsync %s log tail:\n%s", id, d.LogTail(60))
			}
			d.CloseT(t)
		})
		daemons[id] = d
	}

	// Each holds some shards, together all four, none twice.
	var holder map[int]string // shard -> replica
	eventually(t, 60*time.Second, "replicas a and b split the shards", func() error {
		holder = map[int]string{}
		for _, id := range ids {
			code, body, err := daemons[id].Get(ctx, "/debug/shards", "")
			if err != nil {
				return err
			}
			var st struct {
				Shards int   `json:"shards"`
				Held   []int `json:"held"`
			}
			if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
				return fmt.Errorf("%s: GET /debug/shards: %d %s (%v)", id, code, body, err)
			}
			if st.Shards != shards || len(st.Held) == 0 {
				return fmt.Errorf("%s: %s, want %d shards and some held", id, body, shards)
			}
			for _, k := range st.Held {
				if other, ok := holder[k]; ok || k < 0 || k >= shards {
					return fmt.Errorf("shard %d held by %s and %q", k, id, other)
				}
				holder[k] = id
			}
		}
		if len(holder) != shards {
			return fmt.Errorf("shards held %v, want all %d", holder, shards)
		}
		return nil
	})

	syncWeb(t, ctx, c, consul, appNS, cluster)
	// Only the holder of its shard runs a worker for it.
	var workers []string
	for _, id := range ids {
		code, body, err := daemons[id].Get(ctx, "/debug/workers/"+appNS+"/web", "")
		must(t, err)
		switch code {
		case 200:
			workers = append(workers, id)
		case 404:
		default:
			t.Errorf("%s: GET /debug/workers/%s/web: %d %s", id, appNS, code, body)
		}
	}
	if len(workers) != 1 {
		t.Errorf("replicas %v run a worker for web, want exactly one (shards held: %v)", workers, holder)
	}

	// On SIGTERM each replica releases its shards and deletes its replica
	// Lease (the delete verb); the shard Leases stay.
	logs := map[string][]byte{}
	for _, id := range ids {
		err := daemons[id].Terminate()
		log, rerr := os.ReadFile(daemons[id].LogPath)
		must(t, rerr)
		logs[id] = log
		if err != nil {
			t.Errorf("fleetsync %s on SIGTERM: %v", id, err)
		}
	}
	leases, err := c.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: "fleetsync.io/cluster=" + cluster})
	must(t, err)
	var names []string
	for _, l := range leases.Items {
		names = append(names, l.Name)
		if l.Labels["fleetsync.io/role"] == "replica" {
			t.Errorf("replica Lease %s left behind after SIGTERM", l.Name)
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
			t.Errorf("shard Lease %s still held by %q after SIGTERM: it was not released", l.Name, h)
		}
	}
	if len(names) != shards {
		t.Errorf("Leases %v: want the %d shard Leases", names, shards)
	}

	for _, id := range ids {
		if m := regexp.MustCompile(`(?i).*forbidden.*`).Find(logs[id]); m != nil {
			t.Errorf("fleetsync %s was forbidden something: %s", id, m)
		}
	}
}

// installChartRBAC renders profile p for release rel in namespace ns,
// creates its ServiceAccount and RBAC objects (cluster-wide and, when
// sharded, the Lease Role) in the API server, and returns the rendered
// objects and the ServiceAccount's name.
func installChartRBAC(t *testing.T, p chartProfile, rel, ns string) (objects, string) {
	t.Helper()
	o := p.render(t, rel, ns)
	sa := checkRBAC(t, o, ns)
	checkLeaseRBAC(t, o, ns, sa, p.shards > 1)
	kubectl(t, "apply", "-f", writeFile(t, "rbac.yaml", o.only("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding").yaml(t)))
	t.Cleanup(func() {
		_ = runCmd(t, filepath.Join(tools, "kubectl"), "--kubeconfig", kube.KubeconfigPath, "delete", "clusterrole,clusterrolebinding", rel+"-fleetsync")
	})
	return o, sa
}

// saKubeconfig mints a token for ServiceAccount ns/sa (TokenRequest) and
// writes a kubeconfig that authenticates with it alone.
func saKubeconfig(t *testing.T, ns, sa string) string {
	t.Helper()
	tok, err := kube.Client.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	must(t, err)
	return writeFile(t, "kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, kube.URL, base64.StdEncoding.EncodeToString(kube.CAPEM), sa, tok.Status.Token, sa))
}

// waitEventCount waits for fleetsync's InvalidAnnotation Event about
// Service name to have count n.
func waitEventCount(t *testing.T, ns, name string, n int32) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("InvalidAnnotation event on %s/%s with count %d", ns, name, n), func() error {
		list, err := kube.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Reason == "InvalidAnnotation" && e.Source.Component == "fleetsync" && e.Count >= n {
				return nil
			}
			seen = append(seen, fmt.Sprintf("%s x%d", e.Reason, e.Count))
		}
		return fmt.Errorf("events: %v", seen)
	})
}

// checkAccess asks the API server (SubjectAccessReview) what the
// ServiceAccount may do: exactly the daemon's needs, Leases in its own
// namespace only when sharded.
func checkAccess(t *testing.T, ns, sa, appNS string, sharded bool) {
	t.Helper()
	user := "system:serviceaccount:" + ns + ":" + sa
	cases := []struct {
		verb, group, resource, namespace, name string
		allowed                                bool
	}{
		{"list", "", "services", "", "", true},
		{"watch", "", "services", "", "", true},
		{"list", "discovery.k8s.io", "endpointslices", "", "", true},
		{"watch", "discovery.k8s.io", "endpointslices", "", "", true},
		{"list", "", "nodes", "", "", true},
		{"watch", "", "nodes", "", "", true},
		{"list", "networking.k8s.io", "ingresses", "", "", true},
		{"watch", "networking.k8s.io", "ingresses", "", "", true},
		{"create", "", "events", appNS, "", true},
		{"patch", "", "events", appNS, "", true},
		{"get", "", "namespaces", "", "kube-system", true},

		{"get", "", "services", appNS, "web", false},
		{"update", "", "services", appNS, "web", false},
		{"delete", "discovery.k8s.io", "endpointslices", appNS, "", false},
		{"get", "", "nodes", "", "", false},
		{"update", "", "nodes", "", "", false},
		{"patch", "", "nodes", "", "", false},
		{"update", "", "nodes/status", "", "", false},
		{"get", "networking.k8s.io", "ingresses", appNS, "", false},
		{"update", "networking.k8s.io", "ingresses", appNS, "", false},
		{"update", "", "services/status", appNS, "", false},
		{"list", "", "endpoints", "", "", false},
		{"list", "", "pods", "", "", false},
		{"list", "", "secrets", "", "", false},
		{"get", "", "secrets", ns, "", false},
		{"get", "", "namespaces", "", "default", false},
		{"list", "", "namespaces", "", "", false},
		{"delete", "", "events", appNS, "", false},

		{"get", "coordination.k8s.io", "leases", ns, "", sharded},
		{"list", "coordination.k8s.io", "leases", ns, "", sharded},
		{"create", "coordination.k8s.io", "leases", ns, "", sharded},
		{"update", "coordination.k8s.io", "leases", ns, "", sharded},
		{"delete", "coordination.k8s.io", "leases", ns, "", sharded},
		{"watch", "coordination.k8s.io", "leases", ns, "", sharded},
		{"patch", "coordination.k8s.io", "leases", ns, "", false},
		{"deletecollection", "coordination.k8s.io", "leases", ns, "", false},
		{"create", "coordination.k8s.io", "leases", appNS, "", false},
		{"list", "coordination.k8s.io", "leases", "", "", false},
		{"update", "coordination.k8s.io", "leases", "kube-system", "kube-controller-manager", false},
	}
	for _, c := range cases {
		r, err := kube.Client.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authzv1.SubjectAccessReview{
			Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authzv1.ResourceAttributes{Verb: c.verb, Group: c.group, Resource: c.resource, Namespace: c.namespace, Name: c.name}},
		}, metav1.CreateOptions{})
		must(t, err)
		if r.Status.Allowed != c.allowed {
			t.Errorf("%s %s %s (namespace %q, name %q): allowed=%t, want %t", c.verb, c.group, c.resource, c.namespace, c.name, r.Status.Allowed, c.allowed)
		}
	}
}

// webPorts are the ports of the Services these tests create.
var webPorts = map[string]int32{"http": 8080}

// syncWeb creates Service web (two endpoints, opted in) in ns and waits for
// both instances, passing, on cluster's node in agent.
func syncWeb(t *testing.T, ctx context.Context, c kubernetes.Interface, agent *stack.Consul, ns, cluster string) {
	t.Helper()
	optIn := map[string]string{"consul.hashicorp.com/service-sync": "true"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(ns, "web", optIn, webPorts)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(ns, "web", "web-1", discoveryv1.AddressTypeIPv4, webPorts, fixture.IPs(7, 0, 2))))
	eventually(t, 20*time.Second, "web synced into Consul", func() error {
		ins, err := fixture.Instances(agent.Client, "web", "k8s-"+cluster)
		if err != nil {
			return err
		}
		if k := fixture.Keys(ins, true); k != "10.7.0.1:8080=passing,10.7.0.2:8080=passing" {
			return fmt.Errorf("have %q", k)
		}
		return nil
	})
}
