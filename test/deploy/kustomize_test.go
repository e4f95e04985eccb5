package deploy

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

func kustomize(t *testing.T, dir string) objects {
	t.Helper()
	return decodeObjects(t, mustRun(t, filepath.Join(tools, "kubectl"), "kustomize", filepath.Join(kustomizeDir, dir)))
}

// daemonEnvNames returns FLEETSYNC_<FLAG> for every flag of the daemon, read
// from its --help.
func daemonEnvNames(t *testing.T, bin string) map[string]bool {
	t.Helper()
	r := runCmd(t, bin, "--help")
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(r.stderr, -1) {
		names["FLEETSYNC_"+strings.ToUpper(strings.ReplaceAll(m[1], "-", "_"))] = true
	}
	if !names["FLEETSYNC_CLUSTER_ID"] {
		t.Fatalf("no flags in fleetsync --help:\n%s", r.stderr)
	}
	return names
}

// kustomizeDirs are the kustomizations in deploy/kustomize, each with the
// chart profile it must match and how many shards it sets (0: none).
var kustomizeDirs = []struct {
	dir, profile string
	shards       int
	login        bool // logs in with an auth method instead of a token file
}{
	{"base", "minimal", 0, false},
	{"example", "minimal", 0, false},
	{"example-sharded", "sharded", 12, false},
	{"example-login", "minimal", 0, true},
}

// TestKustomize: the base, the example overlay and the sharded one render
// the chart's objects (plus the ConfigMap of settings) with the same RBAC,
// PodDisruptionBudget and pod, and every setting is a variable the daemon
// reads.
func TestKustomize(t *testing.T) {
	needStack(t)
	bin, err := fixture.Build()
	must(t, err)
	envNames := daemonEnvNames(t, bin)
	consulVars := []string{"CONSUL_HTTP_ADDR", "CONSUL_TLS_SERVER_NAME", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY"}

	for _, k := range kustomizeDirs {
		t.Run(k.dir, func(t *testing.T) {
			chart := profile(t, k.profile).render(t, "fleetsync", "fleetsync")
			var chartDep appsv1.Deployment
			chart.one(t, "Deployment", &chartDep)
			o := kustomize(t, k.dir)
			var kinds, chartKinds []string
			for _, u := range o {
				kinds = append(kinds, u.GetKind())
				if u.GetKind() != "ClusterRole" && u.GetKind() != "ClusterRoleBinding" && u.GetNamespace() != "fleetsync" {
					t.Errorf("%s/%s in namespace %q, want fleetsync", u.GetKind(), u.GetName(), u.GetNamespace())
				}
			}
			for _, u := range chart {
				chartKinds = append(chartKinds, u.GetKind())
			}
			chartKinds = append(chartKinds, "ConfigMap")
			slices.Sort(kinds)
			slices.Sort(chartKinds)
			if !slices.Equal(kinds, chartKinds) {
				t.Errorf("kinds %v, want the chart's %v", kinds, chartKinds)
			}
			sa := checkRBAC(t, o, "fleetsync")
			checkLeaseRBAC(t, o, "fleetsync", sa, k.shards > 1)
			var d appsv1.Deployment
			var svc corev1.Service
			var cm corev1.ConfigMap
			o.one(t, "Deployment", &d)
			o.one(t, "Service", &svc)
			o.one(t, "ConfigMap", &cm)
			checkPod(t, &d, sa, &svc)
			c, cc := d.Spec.Template.Spec.Containers[0], chartDep.Spec.Template.Spec.Containers[0]
			if fmt.Sprint(c.SecurityContext, c.LivenessProbe, c.ReadinessProbe, c.Resources, d.Spec.Template.Spec.SecurityContext, d.Spec.Strategy) !=
				fmt.Sprint(cc.SecurityContext, cc.LivenessProbe, cc.ReadinessProbe, cc.Resources, chartDep.Spec.Template.Spec.SecurityContext, chartDep.Spec.Strategy) {
				t.Errorf("pod differs from the chart's:\nkustomize %+v\nchart     %+v", d.Spec.Template.Spec, chartDep.Spec.Template.Spec)
			}
			if (*d.Spec.Replicas > 1) != (*chartDep.Spec.Replicas > 1) {
				t.Errorf("%d replicas, the chart's profile %d", *d.Spec.Replicas, *chartDep.Spec.Replicas)
			}
			if *d.Spec.Replicas > 1 {
				checkPDB(t, o, &d)
				var pdb, chartPDB policyv1.PodDisruptionBudget
				o.one(t, "PodDisruptionBudget", &pdb)
				chart.one(t, "PodDisruptionBudget", &chartPDB)
				if fmt.Sprint(pdb.Spec) != fmt.Sprint(chartPDB.Spec) {
					t.Errorf("PodDisruptionBudget spec %+v, the chart's %+v", pdb.Spec, chartPDB.Spec)
				}
			}
			if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != cm.Name {
				t.Errorf("envFrom %+v, want the ConfigMap %s", c.EnvFrom, cm.Name)
			}
			// The chart's downward API variables, and with sharding the
			// Lease namespace (the pod's: where the Role is) and the
			// replica id (the pod's name).
			env, chartEnv := downwardEnv(c), downwardEnv(cc)
			if k.shards > 1 {
				chartEnv["FLEETSYNC_LEASE_NAMESPACE"] = "metadata.namespace"
				chartEnv["FLEETSYNC_REPLICA_ID"] = "metadata.name"
			}
			if !maps.Equal(env, chartEnv) {
				t.Errorf("downward API variables %v, want %v", env, chartEnv)
			}
			for name := range env {
				if strings.HasPrefix(name, "FLEETSYNC_") && !envNames[name] {
					t.Errorf("variable %s is no variable fleetsync reads", name)
				}
			}
			var settings []string
			for key, v := range cm.Data {
				if !envNames[key] && !slices.Contains(consulVars, key) {
					t.Errorf("ConfigMap key %s is no variable fleetsync reads", key)
				}
				settings = append(settings, key+"="+v)
			}
			// Shards as the overlay says, never fewer than the replicas.
			wantShards := ""
			if k.shards > 1 {
				wantShards = strconv.Itoa(k.shards)
			}
			if got := cm.Data["FLEETSYNC_SHARDS"]; got != wantShards {
				t.Errorf("FLEETSYNC_SHARDS=%q, want %q", got, wantShards)
			}
			if *d.Spec.Replicas > 1 && k.shards < int(*d.Spec.Replicas) {
				t.Errorf("%d replicas with %d shards: want shards >= replicas", *d.Spec.Replicas, k.shards)
			}
			// The settings parse: --version reads them all, then exits.
			r := runCmdEnv(t, settings, bin, "--version")
			if r.code != 0 {
				t.Errorf("fleetsync --version with the ConfigMap's variables: exit %d: %s", r.code, r.stderr)
			}
			if k.dir != "base" {
				if cm.Data["FLEETSYNC_CLUSTER_ID"] == "" || cm.Data["CONSUL_HTTP_ADDR"] == "" || (cm.Data["CONSUL_HTTP_TOKEN_FILE"] == "") != k.login {
					t.Errorf("example overlay ConfigMap %v: want a cluster id and a token file (or, logging in, none)", cm.Data)
				}
				if k.login && (cm.Data["FLEETSYNC_CONSUL_LOGIN_AUTH_METHOD"] == "" || d.Spec.Template.Spec.AutomountServiceAccountToken == nil ||
					!*d.Spec.Template.Spec.AutomountServiceAccountToken) {
					t.Errorf("login overlay: want an auth method and the ServiceAccount token (the bearer token) mounted")
				}
				// checkPod verified the token file is on a mounted
				// volume; here, that the variable points at it.
				d.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "CONSUL_HTTP_TOKEN_FILE", Value: cm.Data["CONSUL_HTTP_TOKEN_FILE"]},
					{Name: "CONSUL_CACERT", Value: cm.Data["CONSUL_CACERT"]}}
				checkPod(t, &d, sa, &svc)
			}
		})
	}
}

func TestKustomizeServerDryRun(t *testing.T) {
	needStack(t)
	createNamespace(t, "fleetsync")
	for _, k := range kustomizeDirs {
		t.Run(k.dir, func(t *testing.T) {
			out := mustRun(t, filepath.Join(tools, "kubectl"), "--kubeconfig", kube.KubeconfigPath,
				"apply", "--dry-run=server", "-k", filepath.Join(kustomizeDir, k.dir))
			want := []string{"serviceaccount/fleetsync", "clusterrole.rbac.authorization.k8s.io/fleetsync",
				"clusterrolebinding.rbac.authorization.k8s.io/fleetsync", "service/fleetsync", "deployment.apps/fleetsync", "configmap/fleetsync-config-"}
			if k.shards > 1 {
				want = append(want, "role.rbac.authorization.k8s.io/fleetsync", "rolebinding.rbac.authorization.k8s.io/fleetsync",
					"poddisruptionbudget.policy/fleetsync")
			}
			for _, w := range want {
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w)).MatchString(out) {
					t.Errorf("kubectl apply -k output lacks %s:\n%s", w, out)
				}
			}
		})
	}
}
