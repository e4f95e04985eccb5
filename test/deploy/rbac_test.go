package deploy

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	o := chartProfiles[0].render(t, rel, ns)
	sa := checkRBAC(t, o, ns)
	kubectl(t, "apply", "-f", writeFile(t, "rbac.yaml", o.only("ServiceAccount", "ClusterRole", "ClusterRoleBinding").yaml(t)))
	t.Cleanup(func() {
		_ = runCmd(t, filepath.Join(tools, "kubectl"), "--kubeconfig", kube.KubeconfigPath, "delete", "clusterrole,clusterrolebinding", rel+"-fleetsync")
	})

	checkAccess(t, ns, sa, appNS)

	tok, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	must(t, err)
	kubeconfig := writeFile(t, "kubeconfig", fmt.Sprintf(`apiVersion: v1
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

	d, err := fixture.StartDaemon(ctx, fixture.DaemonConfig{ClusterID: cluster, Kubeconfig: kubeconfig, ConsulAddr: consul.Addr,
		Namespaces: []string{appNS}, Name: "fleetsync-rbac"})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(60))
		}
		_ = d.Close()
	})

	ports := map[string]int32{"http": 8080}
	optIn := map[string]string{"consul.hashicorp.com/service-sync": "true"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "web", optIn, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(appNS, "web", "web-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(7, 0, 2))))
	eventually(t, 20*time.Second, "web synced into Consul", func() error {
		ins, err := fixture.Instances(consul.Client, "web", "k8s-"+cluster)
		if err != nil {
			return err
		}
		if k := fixture.Keys(ins, true); k != "10.7.0.1:8080=passing,10.7.0.2:8080=passing" {
			return fmt.Errorf("have %q", k)
		}
		return nil
	})

	// A bad annotation is reported as an Event (create); made good and
	// bad again, the same Event is reported again (patch: count 2).
	bad := map[string]string{"consul.hashicorp.com/service-sync": "true", "consul.hashicorp.com/service-port": "grpc"}
	good := map[string]string{"consul.hashicorp.com/service-sync": "true", "consul.hashicorp.com/service-port": "http"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "bad", bad, ports)))
	waitEventCount(t, appNS, "bad", 1)
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "bad", good, ports)))
	eventually(t, 20*time.Second, "worker of the fixed Service valid again", func() error {
		code, body, err := d.Get(ctx, "/debug/workers/"+appNS+"/bad", "")
		if err == nil && (code != 200 || strings.Contains(body, `"state": "invalid"`)) {
			err = fmt.Errorf("%d %s", code, body)
		}
		return err
	})
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "bad", bad, ports)))
	waitEventCount(t, appNS, "bad", 2)

	log, err := os.ReadFile(d.LogPath)
	must(t, err)
	if m := regexp.MustCompile(`(?i).*forbidden.*`).Find(log); m != nil {
		t.Errorf("fleetsync was forbidden something: %s", m)
	}
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
// ServiceAccount may do: exactly the daemon's needs.
func checkAccess(t *testing.T, ns, sa, appNS string) {
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
		{"create", "", "events", appNS, "", true},
		{"patch", "", "events", appNS, "", true},
		{"get", "", "namespaces", "", "kube-system", true},

		{"get", "", "services", appNS, "web", false},
		{"update", "", "services", appNS, "web", false},
		{"delete", "discovery.k8s.io", "endpointslices", appNS, "", false},
		{"list", "", "endpoints", "", "", false},
		{"list", "", "pods", "", "", false},
		{"list", "", "secrets", "", "", false},
		{"get", "", "secrets", ns, "", false},
		{"get", "", "namespaces", "", "default", false},
		{"list", "", "namespaces", "", "", false},
		{"delete", "", "events", appNS, "", false},
		{"create", "coordination.k8s.io", "leases", ns, "", false},
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
