package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// toK8sValues are chart values with the Consul -> Kubernetes direction:
// mirror mode into writeNS, import mode, or both.
func toK8sValues(mirror, imp bool, writeNS string) chartProfile {
	return chartProfile{name: fmt.Sprintf("to-k8s-%t-%t", mirror, imp), values: fmt.Sprintf(`
clusterID: prod-eu-1
consul:
  address: consul-server.consul:8500
toK8s:
  enabled: %t
  import: %t
  writeNamespace: %q
  servicePrefix: c-
  allow: ["web*", "db"]
  deny: ["web-internal"]
  requireTag: mirror
  filter: 'Service.Meta.env == "prod"'
  includeClusters: [west]
  warning: fallback
  critical: drop
  address: lan_ipv4
  window: 250ms
  qps: 50
  burst: 100
  maxWatches: 64
  pollInterval: 2s
  deletionGrace: 1m
`, mirror, imp, writeNS)}
}

// wantMirrorRules and wantImportRules are the least the two modes need
// beyond the ClusterRole: mirror mode writes Services and slices in the
// write namespace; import mode writes slices anywhere and only reads
// Services. No patch, no deletecollection, no get (but of Services in the
// write namespace when consul-k8s's are adopted).
var (
	wantMirrorRules = []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch", "create", "update", "delete"}},
	}
	// wantAdoptRule is the mirror Role's with adoptConsulK8s.
	wantAdoptRule   = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get"}}
	wantImportRules = []rbacv1.PolicyRule{
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
	}
)

// named converts the object of kind called name into into.
func (o objects) named(t *testing.T, kind, name string, into any) bool {
	t.Helper()
	for _, u := range o.ofKind(kind) {
		if u.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
				t.Fatal(err)
			}
			return true
		}
	}
	return false
}

// adoptValues are the values of a switch from consul-k8s's
// syncCatalog.toK8S in place: its domain, and its objects adopted. They
// extend toK8sValues's toK8s map.
const adoptValues = "  consulDomain: corp.consul\n  adoptConsulK8s: true\n"

// TestHelmTemplateToK8s: each mode adds exactly its RBAC (mirror: a Role
// and RoleBinding in the write namespace; import: a ClusterRole and
// binding for slices), the base RBAC stays as it is, the daemon accepts
// every to-k8s flag the chart passes, and the API server accepts the
// objects (server-side dry run). consulDomain, adoptConsulK8s and
// maxWatches are passed only when set.
func TestHelmTemplateToK8s(t *testing.T) {
	needStack(t)
	bin, err := fixture.Build()
	must(t, err)
	for _, tc := range []struct {
		name        string
		mirror, imp bool
		adopt       bool
	}{{"mirror", true, false, false}, {"import", false, true, false}, {"both", true, true, false}, {"off", false, false, false},
		{"mirror adopting", true, false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ns, writeNS := uniq("tok8s-chart"), uniq("tok8s-mirror")
			p := toK8sValues(tc.mirror, tc.imp, writeNS)
			if tc.adopt {
				p.values += adoptValues
				// maxWatches unset: the daemon chooses (none over HTTP/2).
				p.values = strings.Replace(p.values, "  maxWatches: 64\n", "", 1)
			}
			o := p.render(t, "fs", ns)
			var role rbacv1.Role
			var rb rbacv1.RoleBinding
			if got := o.named(t, "Role", "fs-fleetsync-to-k8s", &role) && o.named(t, "RoleBinding", "fs-fleetsync-to-k8s", &rb); got != tc.mirror {
				t.Fatalf("mirror Role and RoleBinding rendered %t, want %t (%v)", got, tc.mirror, o.kinds())
			}
			if tc.mirror {
				want := wantMirrorRules
				if tc.adopt {
					want = append(slices.Clone(want), wantAdoptRule)
				}
				if fmt.Sprint(role.Rules) != fmt.Sprint(want) || role.Namespace != writeNS || rb.Namespace != writeNS ||
					rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Namespace != ns {
					t.Errorf("mirror Role %s/%s rules %v, binding %s %+v %+v", role.Namespace, role.Name, role.Rules, rb.Namespace, rb.RoleRef, rb.Subjects)
				}
			}
			var cr rbacv1.ClusterRole
			var crb rbacv1.ClusterRoleBinding
			if got := o.named(t, "ClusterRole", "fs-fleetsync-to-k8s-import", &cr) && o.named(t, "ClusterRoleBinding", "fs-fleetsync-to-k8s-import", &crb); got != tc.imp {
				t.Fatalf("import ClusterRole and binding rendered %t, want %t (%v)", got, tc.imp, o.kinds())
			}
			if tc.imp && (fmt.Sprint(cr.Rules) != fmt.Sprint(wantImportRules) || crb.RoleRef.Name != cr.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Namespace != ns) {
				t.Errorf("import ClusterRole rules %v, binding %+v %+v", cr.Rules, crb.RoleRef, crb.Subjects)
			}
			var base rbacv1.ClusterRole
			if !o.named(t, "ClusterRole", "fs-fleetsync", &base) || fmt.Sprint(base.Rules) != fmt.Sprint(wantRules) {
				t.Errorf("base ClusterRole rules %v, want %v", base.Rules, wantRules)
			}
			var d appsv1.Deployment
			o.one(t, "Deployment", &d)
			args := d.Spec.Template.Spec.Containers[0].Args
			hasToK8s := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--to-k8s") })
			if hasToK8s != (tc.mirror || tc.imp) {
				t.Errorf("to-k8s flags present %t: %q", hasToK8s, args)
			}
			if tc.mirror && !slices.Contains(args, "--k8s-write-namespace="+writeNS) || tc.imp && !slices.Contains(args, `--to-k8s-filter=Service.Meta.env == "prod"`) ||
				hasToK8s && !tc.adopt && !slices.Contains(args, "--to-k8s-max-watches=64") {
				t.Errorf("args %q", args)
			}
			if tc.adopt && slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--to-k8s-max-watches") }) {
				t.Errorf("maxWatches unset, args %q", args)
			}
			if tc.adopt && (!slices.Contains(args, "--consul-domain=corp.consul") || !slices.Contains(args, "--to-k8s-adopt-consul-k8s=true")) {
				t.Errorf("consulDomain and adoptConsulK8s set, args %q", args)
			}
			if !tc.adopt && slices.ContainsFunc(args, func(a string) bool {
				return strings.HasPrefix(a, "--consul-domain") || strings.HasPrefix(a, "--to-k8s-adopt-consul-k8s")
			}) {
				t.Errorf("consulDomain and adoptConsulK8s unset, args %q", args)
			}
			if r := runCmd(t, bin, append(slices.Clone(args), "--version")...); r.code != 0 {
				t.Errorf("fleetsync %v --version: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
			}
			if tc.mirror || tc.imp {
				createNamespace(t, ns)
				createNamespace(t, writeNS)
				out := kubectl(t, "apply", "--dry-run=server", "-f", writeFile(t, "tok8s.yaml", o.yaml(t)))
				if tc.mirror && !strings.Contains(out, "role.rbac.authorization.k8s.io/fs-fleetsync-to-k8s created (server dry run)") {
					t.Errorf("dry run:\n%s", out)
				}
			}
		})
	}
}

// TestChartToK8sRBACIsSufficient installs the RBAC of a chart with both
// modes on and consul-k8s's objects adopted in the real API server and
// runs fleetsync with the ServiceAccount's token alone: a Consul service
// is mirrored into the write namespace, consul-k8s's ExternalName Service
// of another is adopted and converted, an import-mode Service in another
// namespace gets its slices, and nothing was forbidden. The access reviews
// show the writes stay where each mode needs them.
func TestChartToK8sRBACIsSufficient(t *testing.T) {
	needStack(t)
	consul := stack.ConsulT(t)
	ctx, c := t.Context(), kube.Client
	rel, ns, writeNS, appNS, cluster := uniq("tok8s-rbac"), uniq("fleetsync-tok8s"), uniq("mirror"), uniq("app"), uniq("tok8s")
	for _, n := range []string{ns, writeNS, appNS} {
		createNamespace(t, n)
	}
	p := toK8sValues(true, true, writeNS)
	p.values += adoptValues
	o := p.render(t, rel, ns)
	var acc corev1.ServiceAccount
	o.one(t, "ServiceAccount", &acc)
	sa := acc.Name
	kubectl(t, "apply", "-f", writeFile(t, "rbac.yaml", o.only("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding").yaml(t)))
	t.Cleanup(func() {
		_ = runCmd(t, tools+"/kubectl", "--kubeconfig", kube.KubeconfigPath, "delete", "clusterrole,clusterrolebinding", rel+"-fleetsync", rel+"-fleetsync-to-k8s-import")
	})
	user := "system:serviceaccount:" + ns + ":" + sa
	for _, tc := range []struct {
		verb, group, resource, namespace string
		allowed                          bool
	}{
		{"create", "", "services", writeNS, true},
		{"update", "", "services", writeNS, true},
		{"delete", "", "services", writeNS, true},
		{"create", "discovery.k8s.io", "endpointslices", writeNS, true},
		{"create", "discovery.k8s.io", "endpointslices", appNS, true},
		{"delete", "discovery.k8s.io", "endpointslices", appNS, true},
		{"create", "", "services", appNS, false},
		{"update", "", "services", appNS, false},
		{"delete", "", "services", appNS, false},
		{"patch", "", "services", writeNS, false},
		{"patch", "discovery.k8s.io", "endpointslices", appNS, false},
		{"deletecollection", "discovery.k8s.io", "endpointslices", appNS, false},
		{"deletecollection", "", "services", writeNS, false},
		{"get", "", "secrets", writeNS, false},
		{"get", "", "services", writeNS, true}, // adoptConsulK8s reads consul-k8s's Service by name
		{"get", "", "services", appNS, false},
	} {
		r, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
			Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authzv1.ResourceAttributes{Verb: tc.verb, Group: tc.group, Resource: tc.resource, Namespace: tc.namespace}},
		}, metav1.CreateOptions{})
		must(t, err)
		if r.Status.Allowed != tc.allowed {
			t.Errorf("%s %s %s in %s: allowed=%t, want %t", tc.verb, tc.group, tc.resource, tc.namespace, r.Status.Allowed, tc.allowed)
		}
	}

	name := cluster + "-db"
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: cluster + "-vm", Address: "10.90.0.1",
		Service: &consulapi.AgentService{ID: "db1", Service: name, Port: 5432}}, nil)
	must(t, err)
	t.Cleanup(func() {
		_, _ = consul.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: cluster + "-vm"}, nil)
	})
	must(t, fixture.ApplyService(ctx, c, fixture.Service(appNS, "db", map[string]string{"fleetsync.io/consul-service": name}, map[string]int32{"pg": 5432})))
	// consul-k8s's object of a mirrored name (its catalog sync's sink.go).
	web := cluster + "-web"
	_, err = consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: cluster + "-vm", Address: "10.90.0.1",
		Service: &consulapi.AgentService{ID: "web1", Service: web, Port: 80}}, nil)
	must(t, err)
	theirs, err := c.CoreV1().Services(writeNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: writeNS, Name: web,
		Labels: map[string]string{"consul": "true"}, Annotations: map[string]string{"consul.hashicorp.com/service-sync": "false"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: web + ".service.corp.consul"}}, metav1.CreateOptions{})
	must(t, err)
	d, err := fixture.StartDaemon(ctx, fixture.DaemonConfig{ClusterID: cluster, Kubeconfig: saKubeconfig(t, ns, sa), ConsulAddr: consul.Addr,
		Namespaces: []string{appNS}, Name: "fleetsync-tok8s-rbac",
		Args: []string{"--to-k8s", "--to-k8s-import", "--k8s-write-namespace=" + writeNS, "--to-k8s-allow=" + name + "," + web,
			"--to-k8s-adopt-consul-k8s", "--consul-domain=corp.consul"}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(60))
		}
		d.CloseT(t)
	})
	slicesOf := func(ns, svc string) func() error {
		return func() error {
			l, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
			if err == nil && (len(l.Items) != 1 || len(l.Items[0].Endpoints) != 1 || l.Items[0].Endpoints[0].Addresses[0] != "10.90.0.1") {
				err = fmt.Errorf("%d slices of %s/%s", len(l.Items), ns, svc)
			}
			return err
		}
	}
	eventually(t, 30*time.Second, "the mirrored Service's slice", slicesOf(writeNS, name))
	eventually(t, 30*time.Second, "the import-mode Service's slice", slicesOf(appNS, "db"))
	// Adopted (the mark on), then converted to a ClusterIP Service (a new
	// UID) with a slice.
	eventually(t, 30*time.Second, "consul-k8s's Service adopted and converted", func() error {
		s, err := c.CoreV1().Services(writeNS).Get(ctx, web, metav1.GetOptions{})
		if err == nil && (s.Labels["fleetsync.io/cluster"] != cluster || s.Spec.Type != corev1.ServiceTypeClusterIP || s.UID == theirs.UID) {
			err = fmt.Errorf("%s/%s: labels %v, type %s, uid %s (consul-k8s's: %s)", writeNS, web, s.Labels, s.Spec.Type, s.UID, theirs.UID)
		}
		return err
	})
	eventually(t, 30*time.Second, "the adopted Service's slice", slicesOf(writeNS, web))
	if _, err := c.CoreV1().Services(writeNS).Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("mirrored Service: %v", err)
	}
	log, err := os.ReadFile(d.LogPath)
	must(t, err)
	if m := regexp.MustCompile(`(?i).*forbidden.*`).Find(log); m != nil {
		t.Errorf("fleetsync was forbidden something: %s", m)
	}
}

// TestKustomizeToK8s: the example-to-k8s overlay adds the chart's to-k8s
// RBAC (the same rules; the mirror Role in fleetsync's namespace, the
// write namespace by default) to the example's objects, its settings are
// variables the daemon reads and parse, and the API server accepts it all
// (server-side dry run).
func TestKustomizeToK8s(t *testing.T) {
	needStack(t)
	bin, err := fixture.Build()
	must(t, err)
	o := kustomize(t, "example-to-k8s")
	var role rbacv1.Role
	var cr, base rbacv1.ClusterRole
	var rb rbacv1.RoleBinding
	var crb rbacv1.ClusterRoleBinding
	if !o.named(t, "Role", "fleetsync-to-k8s", &role) || !o.named(t, "RoleBinding", "fleetsync-to-k8s", &rb) ||
		!o.named(t, "ClusterRole", "fleetsync-to-k8s-import", &cr) || !o.named(t, "ClusterRoleBinding", "fleetsync-to-k8s-import", &crb) ||
		!o.named(t, "ClusterRole", "fleetsync", &base) {
		t.Fatalf("objects %v", o.kinds())
	}
	if fmt.Sprint(role.Rules) != fmt.Sprint(wantMirrorRules) || role.Namespace != "fleetsync" || rb.RoleRef.Name != role.Name ||
		fmt.Sprint(cr.Rules) != fmt.Sprint(wantImportRules) || crb.RoleRef.Name != cr.Name || fmt.Sprint(base.Rules) != fmt.Sprint(wantRules) {
		t.Errorf("rules: mirror %v in %s, import %v, base %v", role.Rules, role.Namespace, cr.Rules, base.Rules)
	}
	for _, s := range append(rb.Subjects, crb.Subjects...) {
		if s.Kind != "ServiceAccount" || s.Name != "fleetsync" || s.Namespace != "fleetsync" {
			t.Errorf("subject %+v", s)
		}
	}
	var cm corev1.ConfigMap
	o.one(t, "ConfigMap", &cm)
	names := daemonEnvNames(t, bin)
	var settings []string
	for k, v := range cm.Data {
		if strings.HasPrefix(k, "FLEETSYNC_") && !names[k] {
			t.Errorf("ConfigMap key %s is no variable fleetsync reads", k)
		}
		settings = append(settings, k+"="+v)
	}
	if cm.Data["FLEETSYNC_TO_K8S"] != "true" || cm.Data["FLEETSYNC_TO_K8S_IMPORT"] != "true" ||
		cm.Data["FLEETSYNC_CONSUL_DOMAIN"] != "consul" || cm.Data["FLEETSYNC_TO_K8S_ADOPT_CONSUL_K8S"] != "" {
		t.Errorf("settings %v", cm.Data)
	}
	if r := runCmdEnv(t, settings, bin, "--version"); r.code != 0 {
		t.Errorf("fleetsync --version with the ConfigMap's variables: exit %d: %s", r.code, r.stderr)
	}
	createNamespace(t, "fleetsync")
	out := kubectl(t, "apply", "--dry-run=server", "-k", kustomizeDir+"/example-to-k8s")
	for _, w := range []string{"role.rbac.authorization.k8s.io/fleetsync-to-k8s", "clusterrole.rbac.authorization.k8s.io/fleetsync-to-k8s-import"} {
		if !strings.Contains(out, w) {
			t.Errorf("kubectl apply -k output lacks %s:\n%s", w, out)
		}
	}
}

// TestKustomizeToK8sAdopt: the Component to-k8s-adopt-consul-k8s on the
// example-to-k8s overlay turns the adoption on and adds to the mirror Role
// exactly the chart's get of Services (adoptConsulK8s), which
// TestChartToK8sRBACIsSufficient shows the adoption needs; the API server
// accepts it (server-side dry run).
func TestKustomizeToK8sAdopt(t *testing.T) {
	needStack(t)
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, kustomizeDir)
	must(t, err)
	// kustomize refuses absolute paths of resources and components.
	must(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %[1]s/example-to-k8s
components:
  - %[1]s/components/to-k8s-adopt-consul-k8s
`, filepath.ToSlash(rel))), 0o600))
	overlay, err := filepath.Rel(kustomizeDir, dir)
	must(t, err)
	o := kustomize(t, overlay)
	var role rbacv1.Role
	var cm corev1.ConfigMap
	if !o.named(t, "Role", "fleetsync-to-k8s", &role) {
		t.Fatalf("objects %v", o.kinds())
	}
	o.one(t, "ConfigMap", &cm)
	if want := append(slices.Clone(wantMirrorRules), wantAdoptRule); fmt.Sprint(role.Rules) != fmt.Sprint(want) {
		t.Errorf("mirror Role rules %v, want %v", role.Rules, want)
	}
	if cm.Data["FLEETSYNC_TO_K8S_ADOPT_CONSUL_K8S"] != "true" || cm.Data["FLEETSYNC_TO_K8S"] != "true" {
		t.Errorf("settings %v", cm.Data)
	}
	createNamespace(t, "fleetsync")
	if out := kubectl(t, "apply", "--dry-run=server", "-k", dir); !strings.Contains(out, "role.rbac.authorization.k8s.io/fleetsync-to-k8s") {
		t.Errorf("kubectl apply -k output lacks the Role:\n%s", out)
	}
}
