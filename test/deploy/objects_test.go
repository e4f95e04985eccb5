package deploy

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// objects is a rendered manifest, decoded.
type objects []*unstructured.Unstructured

func decodeObjects(t *testing.T, manifest string) objects {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var out objects
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decode manifest: %v\n%s", err, manifest)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// kinds lists "Kind/name" of every object, in order.
func (o objects) kinds() []string {
	var ks []string
	for _, u := range o {
		ks = append(ks, u.GetKind()+"/"+u.GetName())
	}
	return ks
}

func (o objects) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range o {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// one converts the only object of kind into into (a typed API object).
func (o objects) one(t *testing.T, kind string, into any) {
	t.Helper()
	list := o.ofKind(kind)
	if len(list) != 1 {
		t.Fatalf("%d objects of kind %s, want 1 (have %v)", len(list), kind, o.kinds())
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(list[0].Object, into, true); err != nil {
		t.Fatalf("%s: %v", kind, err)
	}
}

// only keeps the objects of the given kinds.
func (o objects) only(kinds ...string) objects {
	var out objects
	for _, u := range o {
		for _, k := range kinds {
			if u.GetKind() == k {
				out = append(out, u)
			}
		}
	}
	return out
}

// yaml renders o as a multi-document manifest (JSON documents are YAML).
func (o objects) yaml(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, u := range o {
		j, err := u.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(j)
		b.WriteString("\n")
	}
	return b.String()
}

// checkPod asserts what every way of deploying fleetsync must give its pod:
// the pod security settings, the probes on the http port, the service
// account, and a Service (when svc is not nil) that selects it.
func checkPod(t *testing.T, d *appsv1.Deployment, sa string, svc *corev1.Service) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != sa {
		t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, sa)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil ||
		psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot, a non-zero runAsUser, seccomp RuntimeDefault", psc)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil ||
		!*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container securityContext %+v: want no privilege escalation, read-only root, drop ALL", sc)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 9090 {
		t.Errorf("ports %+v, want http 9090", c.Ports)
	}
	probe := func(p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "http" {
			t.Errorf("probe %+v, want GET %s on port http", p, path)
		}
	}
	probe(c.LivenessProbe, "/healthz")
	probe(c.ReadinessProbe, "/readyz")
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want memory request and limit", c.Resources)
	}
	if !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("Deployment selector %v does not select its pods %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	if svc != nil {
		if !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, d.Spec.Template.Labels)
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "http" {
			t.Errorf("Service ports %+v, want one to target port http", svc.Spec.Ports)
		}
		if svc.Annotations["consul.hashicorp.com/service-sync"] != "false" {
			t.Errorf("Service annotations %v: fleetsync's own Service must opt out of syncing", svc.Annotations)
		}
	}
	// Every $(VAR) in the args is a variable of the container (else
	// Kubernetes passes "$(VAR)" as is).
	for _, a := range c.Args {
		for _, m := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == m[1] }) {
				t.Errorf("arg %q refers to $(%s), which the container does not set", a, m[1])
			}
		}
	}
	// Every file a CONSUL_* variable names is on a mounted volume.
	mounts := map[string]corev1.Volume{}
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name {
				mounts[m.MountPath] = v
			}
		}
	}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "CONSUL_") || !strings.HasPrefix(e.Value, "/") {
			continue
		}
		if !fileOnVolume(e.Value, mounts) {
			t.Errorf("%s=%s is on no mounted volume (mounts %v)", e.Name, e.Value, mounts)
		}
	}
}

func fileOnVolume(path string, mounts map[string]corev1.Volume) bool {
	for dir, v := range mounts {
		if !strings.HasPrefix(path, dir+"/") {
			continue
		}
		file := strings.TrimPrefix(path, dir+"/")
		var items []corev1.KeyToPath
		switch {
		case v.Secret != nil:
			items = v.Secret.Items
		case v.ConfigMap != nil:
			items = v.ConfigMap.Items
		}
		if len(items) == 0 {
			return true // every key is a file
		}
		for _, it := range items {
			if it.Path == file {
				return true
			}
		}
	}
	return false
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// wantRules is the least privilege fleetsync needs, as the ClusterRole must
// say it.
var wantRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get"}},
}

func checkRBAC(t *testing.T, o objects, ns string) (sa string) {
	t.Helper()
	var (
		acc  corev1.ServiceAccount
		role rbacv1.ClusterRole
		bind rbacv1.ClusterRoleBinding
	)
	o.one(t, "ServiceAccount", &acc)
	o.one(t, "ClusterRole", &role)
	o.one(t, "ClusterRoleBinding", &bind)
	if got, want := fmt.Sprint(role.Rules), fmt.Sprint(wantRules); got != want {
		t.Errorf("ClusterRole rules:\n got %s\nwant %s", got, want)
	}
	if bind.RoleRef.Kind != "ClusterRole" || bind.RoleRef.Name != role.Name {
		t.Errorf("binding roleRef %+v, want ClusterRole %s", bind.RoleRef, role.Name)
	}
	if len(bind.Subjects) != 1 || bind.Subjects[0].Kind != "ServiceAccount" || bind.Subjects[0].Name != acc.Name || bind.Subjects[0].Namespace != ns {
		t.Errorf("binding subjects %+v, want ServiceAccount %s/%s", bind.Subjects, ns, acc.Name)
	}
	if acc.Namespace != ns {
		t.Errorf("ServiceAccount namespace %q, want %q", acc.Namespace, ns)
	}
	return acc.Name
}

// wantLeaseRules is what the Role of a sharded install must grant: the
// Lease calls of supervisor/shard and of client-go's leader election
// (resourcelock.LeaseLock: get, create, update), the Lease watch of the
// shard manager (list, watch); no patch.
var wantLeaseRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
}

// checkLeaseRBAC asserts, when sharded, exactly one Role (wantLeaseRules)
// and one RoleBinding of it to ServiceAccount ns/sa, both in namespace ns;
// otherwise neither.
func checkLeaseRBAC(t *testing.T, o objects, ns, sa string, sharded bool) {
	t.Helper()
	if !sharded {
		if n := len(o.ofKind("Role")) + len(o.ofKind("RoleBinding")); n > 0 {
			t.Errorf("%d Roles and RoleBindings without sharding, want none (have %v)", n, o.kinds())
		}
		return
	}
	var (
		role rbacv1.Role
		bind rbacv1.RoleBinding
	)
	o.one(t, "Role", &role)
	o.one(t, "RoleBinding", &bind)
	if got, want := fmt.Sprint(role.Rules), fmt.Sprint(wantLeaseRules); got != want {
		t.Errorf("Role rules:\n got %s\nwant %s", got, want)
	}
	if role.Namespace != ns || bind.Namespace != ns {
		t.Errorf("Role in namespace %q, RoleBinding in %q, want both in %q", role.Namespace, bind.Namespace, ns)
	}
	if bind.RoleRef.Kind != "Role" || bind.RoleRef.Name != role.Name {
		t.Errorf("RoleBinding roleRef %+v, want Role %s", bind.RoleRef, role.Name)
	}
	if len(bind.Subjects) != 1 || bind.Subjects[0].Kind != "ServiceAccount" || bind.Subjects[0].Name != sa || bind.Subjects[0].Namespace != ns {
		t.Errorf("RoleBinding subjects %+v, want ServiceAccount %s/%s", bind.Subjects, ns, sa)
	}
}

// checkPDB asserts a PodDisruptionBudget that lets one pod of d go at a
// time.
func checkPDB(t *testing.T, o objects, d *appsv1.Deployment) {
	t.Helper()
	var pdb policyv1.PodDisruptionBudget
	o.one(t, "PodDisruptionBudget", &pdb)
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" ||
		pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PodDisruptionBudget spec %+v: want maxUnavailable 1 selecting the pods", pdb.Spec)
	}
	if pdb.Namespace != d.Namespace {
		t.Errorf("PodDisruptionBudget in namespace %q, the Deployment in %q", pdb.Namespace, d.Namespace)
	}
}

// downwardEnv maps each variable of c set from the downward API to its
// field path.
func downwardEnv(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			out[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	return out
}
