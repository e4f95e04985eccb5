package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// chartProfile is one way to install the chart.
type chartProfile struct {
	name   string
	values string // values file content
	kinds  []string
	shards int // the shards value (0: the default, 1)
}

var baseKinds = []string{"ServiceAccount", "Service", "ClusterRole", "ClusterRoleBinding", "Deployment"}

var chartProfiles = []chartProfile{
	{name: "minimal", values: `
clusterID: prod-eu-1
consul:
  address: consul-server.consul:8500
`, kinds: baseKinds},
	{name: "everything", values: `
clusterID: prod-eu-1
consul:
  address: https://consul-server.consul:8501
  tokenSecret: {name: fleetsync-consul-token, key: acl-token}
  ca: {secretName: consul-ca, key: tls.crt}
  clientCertSecret: fleetsync-consul-client
  tlsServerName: server.dc1.consul
  nodes: 16
sync:
  defaultSync: true
  allowNamespaces: ["team-*", "shop"]
  denyNamespaces: []
  window: 250ms
  servicePrefix: k8s-
  addNamespaceSuffix: true
  k8sTag: ""
  terminating: drop
  registerNotReady: true
  nodePortSyncType: InternalOnly
  syncClusterIPServices: false
  syncLoadBalancerEndpoints: true
  ingress: {enabled: true, loadBalancerIPs: true}
  consulK8sMeta: true
writeBudget: {maxWritesPerSecond: 50, burst: 20, maxInflight: 4}
log: {level: debug, json: false}
metrics:
  perWorker: top-50
  serviceMonitor: {enabled: true, labels: {release: kube-prometheus}, interval: 15s, scrapeTimeout: 5s}
replicas: 2
shards: 8
leaseDuration: 20s
leaseRenewDeadline: 12s
leaseRetryPeriod: 3s
shutdownTimeout: 20s
terminationGracePeriodSeconds: 45
resources:
  requests: {cpu: 250m, memory: 256Mi}
  limits: {memory: 2Gi}
podAnnotations: {example.com/team: platform}
podLabels: {tier: control}
priorityClassName: system-cluster-critical
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/name: fleetsync}}
extraArgs: ["--informer-resync=10m"]
extraEnv: [{name: GOMAXPROCS, value: "2"}]
`, kinds: append(slices.Clone(baseKinds), "PodDisruptionBudget", "ServiceMonitor", "Role", "RoleBinding"), shards: 8},
	{name: "ca-from-configmap", values: `
clusterID: west
consul:
  address: https://consul:8501
  ca: {configMapName: consul-ca}
serviceAccount: {name: custom-sa, annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/x"}}
`, kinds: baseKinds},
	// A consul-k8s install with manageSystemACLs: three servers, the
	// component auth method, a datacenter; Enterprise scope.
	{name: "login", values: `
clusterID: prod-eu-1
consul:
  address: https://consul-server-0.consul-server.consul.svc:8501
  extraAddresses: [consul-server-1.consul-server.consul.svc:8501, consul-server-2.consul-server.consul.svc:8501]
  tlsServerName: server.dc1.consul
  ca: {secretName: consul-ca-cert, key: tls.crt}
  datacenter: dc1
  partition: team-a
  enableNamespaces: true
  mirrorK8sNamespacesPrefix: k8s-
  crossNamespaceACLPolicy: cross-namespace-policy
  login:
    enabled: true
    authMethod: consul-consul-k8s-component-auth-method
    datacenter: dc1
    meta: {component: fleetsync}
`, kinds: baseKinds},
	// Three replicas splitting eight shards, default lease timing.
	{name: "sharded", values: `
clusterID: prod-eu-1
consul:
  address: consul-server.consul:8500
replicas: 3
shards: 8
`, kinds: append(slices.Clone(baseKinds), "PodDisruptionBudget", "Role", "RoleBinding"), shards: 8},
}

// profile returns the chart profile called name.
func profile(t *testing.T, name string) chartProfile {
	t.Helper()
	for _, p := range chartProfiles {
		if p.name == name {
			return p
		}
	}
	t.Fatalf("no chart profile %q", name)
	return chartProfile{}
}

func (p chartProfile) valuesFile(t *testing.T) string { return writeFile(t, p.name+".yaml", p.values) }

// render runs helm template for release rel in namespace ns.
func (p chartProfile) render(t *testing.T, rel, ns string) objects {
	t.Helper()
	return decodeObjects(t, helm(t, "template", rel, chartDir, "--namespace", ns, "-f", p.valuesFile(t)))
}

func TestHelmLint(t *testing.T) {
	needStack(t)
	for _, p := range chartProfiles {
		t.Run(p.name, func(t *testing.T) {
			out := helm(t, "lint", "--strict", chartDir, "-f", p.valuesFile(t))
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("helm lint:\n%s", out)
			}
		})
	}
}

// TestHelmRejectsBadValues: what would start a broken daemon fails at
// render time with a message that says what to set.
func TestHelmRejectsBadValues(t *testing.T) {
	needStack(t)
	cases := []struct{ name, values, want string }{
		{"no cluster id", "consul: {address: c:8500}", "clusterID is required"},
		{"cluster id not a DNS label", "clusterID: Prod_1\nconsul: {address: c:8500}", "/clusterID"},
		{"no consul address", "clusterID: prod", "consul.address is required"},
		{"two CA sources", "clusterID: prod\nconsul: {address: c:8500, ca: {secretName: a, configMapName: b}}", "set secretName or configMapName, not both"},
		{"bad terminating policy", "clusterID: prod\nconsul: {address: c:8500}\nsync: {terminating: maybe}", "/sync/terminating"},
		{"bad consul domain", "clusterID: prod\nconsul: {address: c:8500}\ntoK8s: {enabled: true, consulDomain: Corp_Consul}", "/toK8s/consulDomain"},
		{"bad per-worker setting", "clusterID: prod\nconsul: {address: c:8500}\nmetrics: {perWorker: some}", "/metrics/perWorker"},
		{"ServiceMonitor without Service", "clusterID: prod\nconsul: {address: c:8500}\nservice: {enabled: false}\nmetrics: {serviceMonitor: {enabled: true}}",
			"needs service.enabled"},
		// Replicas that would all sync everything.
		{"replicas without shards", "clusterID: prod\nconsul: {address: c:8500}\nreplicas: 3", "replicas=3 needs shards > 1"},
		{"replicas with one shard", "clusterID: prod\nconsul: {address: c:8500}\nreplicas: 2\nshards: 1", "replicas=2 needs shards > 1"},
		{"zero shards", "clusterID: prod\nconsul: {address: c:8500}\nshards: 0", "/shards"},
		{"too many shards", "clusterID: prod\nconsul: {address: c:8500}\nshards: 2000", "/shards"},
		{"lease duration not a duration", "clusterID: prod\nconsul: {address: c:8500}\nreplicas: 2\nshards: 8\nleaseDuration: 15 seconds", "/leaseDuration"},
		{"login without an auth method", "clusterID: prod\nconsul: {address: c:8500, login: {enabled: true}}", "consul.login.authMethod is required"},
		{"login and a token", "clusterID: prod\nconsul: {address: c:8500, tokenSecret: {name: t}, login: {enabled: true, authMethod: m}}", "set one"},
		{"mirroring and a namespace", "clusterID: prod\nconsul: {address: c:8500, namespace: a, mirrorK8sNamespaces: true}", "set one"},
		{"namespaces (mirroring by default) and a namespace", "clusterID: prod\nconsul: {address: c:8500, namespace: a, enableNamespaces: true}",
			"set consul.mirrorK8sNamespaces: false"},
		{"extra address not host:port", "clusterID: prod\nconsul: {address: c:8500, extraAddresses: [\"c2\"]}", "/consul/extraAddresses/0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCmd(t, filepath.Join(tools, "helm"), "template", "x", chartDir, "-f", writeFile(t, "v.yaml", c.values))
			if r.code == 0 || !strings.Contains(r.stderr, c.want) {
				t.Errorf("exit %d, stderr %q: want a failure mentioning %q", r.code, r.stderr, c.want)
			}
		})
	}
}

func TestHelmTemplate(t *testing.T) {
	needStack(t)
	bin, err := fixture.Build()
	must(t, err)
	for _, p := range chartProfiles {
		t.Run(p.name, func(t *testing.T) {
			o := p.render(t, "fs", "fleetsync")
			var gotKinds []string
			for _, u := range o {
				gotKinds = append(gotKinds, u.GetKind())
			}
			slices.Sort(gotKinds)
			want := slices.Clone(p.kinds)
			slices.Sort(want)
			if !slices.Equal(gotKinds, want) {
				t.Fatalf("kinds %v, want %v", gotKinds, want)
			}
			for _, u := range o {
				if u.GetNamespace() != "fleetsync" && u.GetKind() != "ClusterRole" && u.GetKind() != "ClusterRoleBinding" {
					t.Errorf("%s/%s in namespace %q, want the release namespace", u.GetKind(), u.GetName(), u.GetNamespace())
				}
			}
			sa := checkRBAC(t, o, "fleetsync")
			checkLeaseRBAC(t, o, "fleetsync", sa, p.shards > 1)
			var d appsv1.Deployment
			var svc corev1.Service
			o.one(t, "Deployment", &d)
			o.one(t, "Service", &svc)
			checkPod(t, &d, sa, &svc)
			checkChartSharding(t, &d, "fleetsync", p.shards)
			if *d.Spec.Replicas > 1 {
				checkPDB(t, o, &d)
			}
			// The daemon accepts every flag the chart passes: --version
			// parses all of them (unknown flags and bad values fail) and
			// exits before connecting anywhere.
			args := d.Spec.Template.Spec.Containers[0].Args
			r := runCmd(t, bin, append(slices.Clone(args), "--version")...)
			if r.code != 0 || !strings.HasPrefix(r.stdout, "fleetsync ") {
				t.Errorf("fleetsync %v --version: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
			}
		})
	}
}

// checkChartSharding asserts the flags of shards (0 or 1: none) in the
// chart's Deployment d of namespace ns: --shards, the Leases in the release
// namespace (where the Role is), the pod name as replica id; and that more
// than one replica comes with more than one shard.
func checkChartSharding(t *testing.T, d *appsv1.Deployment, ns string, shards int) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	if env := downwardEnv(c); env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("downward API variables %v: want POD_NAME (metadata.name) and POD_NAMESPACE (metadata.namespace)", env)
	}
	var got []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--shards=") || strings.HasPrefix(a, "--lease-namespace=") || strings.HasPrefix(a, "--replica-id=") {
			got = append(got, a)
		}
	}
	var want []string
	if shards > 1 {
		want = []string{fmt.Sprintf("--shards=%d", shards), "--lease-namespace=" + ns, "--replica-id=$(POD_NAME)"}
	}
	if !slices.Equal(got, want) {
		t.Errorf("sharding flags %q, want %q", got, want)
	}
	if *d.Spec.Replicas > 1 && shards < 2 {
		t.Errorf("%d replicas with %d shards: every replica would sync every Service", *d.Spec.Replicas, shards)
	}
}

// TestHelmTemplateValues: values land in the pod as the flags and files
// they mean.
func TestHelmTemplateValues(t *testing.T) {
	needStack(t)
	var d appsv1.Deployment
	o := chartProfiles[1].render(t, "fs", "fleetsync")
	o.one(t, "Deployment", &d)
	pod := d.Spec.Template
	c := pod.Spec.Containers[0]
	for _, a := range []string{"--cluster-id=prod-eu-1", "--default-sync=true", "--allow-namespace=team-*,shop", "--deny-namespace=",
		"--window=250ms", "--service-prefix=k8s-", "--add-namespace-suffix=true", "--k8s-tag=", "--terminating=drop",
		"--register-not-ready=true", "--node-port-sync-type=InternalOnly", "--sync-clusterip-services=false",
		"--sync-lb-services-endpoints=true", "--enable-ingress=true", "--loadbalancer-ips=true", "--consul-k8s-meta=true",
		"--consul-max-writes-per-second=50", "--consul-write-burst=20", "--consul-max-inflight=4", "--consul-nodes=16",
		"--metrics-per-worker=top-50", "--http-addr=:9090", "--shutdown-timeout=20s", "--log-level=debug", "--log-json=false",
		"--shards=8", "--lease-namespace=fleetsync", "--replica-id=$(POD_NAME)", "--lease-duration=20s", "--lease-renew-deadline=12s",
		"--lease-retry-period=3s", "--informer-resync=10m"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("args %q lack %q", c.Args, a)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["CONSUL_HTTP_ADDR"] != "https://consul-server.consul:8501" || env["CONSUL_TLS_SERVER_NAME"] != "server.dc1.consul" ||
		env["CONSUL_HTTP_TOKEN_FILE"] != "/etc/fleetsync/consul-token/token" || env["CONSUL_CACERT"] != "/etc/fleetsync/consul-ca/ca.crt" ||
		env["CONSUL_CLIENT_CERT"] == "" || env["CONSUL_CLIENT_KEY"] == "" || env["GOMAXPROCS"] != "2" {
		t.Errorf("env %v", env)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols["consul-token"]; v.Secret == nil || v.Secret.SecretName != "fleetsync-consul-token" || v.Secret.Items[0].Key != "acl-token" {
		t.Errorf("token volume %+v", v)
	}
	if v := vols["consul-ca"]; v.Secret == nil || v.Secret.SecretName != "consul-ca" || v.Secret.Items[0].Key != "tls.crt" {
		t.Errorf("CA volume %+v", v)
	}
	if *d.Spec.Replicas != 2 || pod.Annotations["example.com/team"] != "platform" || pod.Labels["tier"] != "control" ||
		pod.Spec.NodeSelector["kubernetes.io/os"] != "linux" || len(pod.Spec.Tolerations) != 1 || pod.Spec.Affinity == nil ||
		pod.Spec.PriorityClassName != "system-cluster-critical" || *pod.Spec.TerminationGracePeriodSeconds != 45 ||
		c.Resources.Limits.Memory().String() != "2Gi" {
		t.Errorf("pod spec: replicas %d, %+v", *d.Spec.Replicas, pod)
	}
	sm := o.ofKind("ServiceMonitor")[0]
	if sm.GetLabels()["release"] != "kube-prometheus" {
		t.Errorf("ServiceMonitor labels %v", sm.GetLabels())
	}

	var cm appsv1.Deployment
	chartProfiles[2].render(t, "fs", "fleetsync").one(t, "Deployment", &cm)
	for _, v := range cm.Spec.Template.Spec.Volumes {
		if v.Name == "consul-ca" && (v.ConfigMap == nil || v.ConfigMap.Name != "consul-ca" || v.ConfigMap.Items[0].Key != "ca.crt") {
			t.Errorf("CA from ConfigMap: %+v", v)
		}
	}
	if cm.Spec.Template.Spec.ServiceAccountName != "custom-sa" {
		t.Errorf("serviceAccount.name ignored: %q", cm.Spec.Template.Spec.ServiceAccountName)
	}

	// The login profile: the auth method, the addresses, the datacenter
	// and the scope as flags; no token file; the ServiceAccount token
	// (the bearer token) mounted at its default path.
	var lg appsv1.Deployment
	profile(t, "login").render(t, "fs", "fleetsync").one(t, "Deployment", &lg)
	lc := lg.Spec.Template.Spec.Containers[0]
	for _, a := range []string{"--consul-login-auth-method=consul-consul-k8s-component-auth-method", "--consul-login-datacenter=dc1",
		"--consul-login-meta=component=fleetsync", "--consul-datacenter=dc1", "--consul-partition=team-a",
		"--enable-namespaces=true", "--k8s-namespace-mirroring-prefix=k8s-", "--consul-cross-namespace-acl-policy=cross-namespace-policy",
		"--consul-address=https://consul-server-0.consul-server.consul.svc:8501,consul-server-1.consul-server.consul.svc:8501,consul-server-2.consul-server.consul.svc:8501"} {
		if !slices.Contains(lc.Args, a) {
			t.Errorf("login profile: args %q lack %q", lc.Args, a)
		}
	}
	for _, e := range lc.Env {
		if e.Name == "CONSUL_HTTP_TOKEN_FILE" {
			t.Errorf("login profile sets %s", e.Name)
		}
	}
	if lg.Spec.Template.Spec.AutomountServiceAccountToken == nil || !*lg.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Error("login profile: the ServiceAccount token (the bearer token) is not mounted")
	}
	// Without login, none of its flags.
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--consul-login") || strings.HasPrefix(a, "--consul-namespace") || strings.HasPrefix(a, "--enable-k8s-namespace-mirroring") ||
			strings.HasPrefix(a, "--enable-namespaces") || strings.HasPrefix(a, "--consul-cross-namespace") {
			t.Errorf("everything profile passes %q", a)
		}
	}

	// Lease timing flags only when set.
	var sh appsv1.Deployment
	profile(t, "sharded").render(t, "fs", "fleetsync").one(t, "Deployment", &sh)
	for _, a := range sh.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--lease-duration") || strings.HasPrefix(a, "--lease-renew-deadline") || strings.HasPrefix(a, "--lease-retry-period") {
			t.Errorf("lease timing %q passed without a value set", a)
		}
	}
	// rbac.create=false: no Role either.
	norbac := chartProfile{name: "sharded-no-rbac", values: profile(t, "sharded").values + "rbac: {create: false}\n"}
	if o := norbac.render(t, "fs", "fleetsync").only("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"); len(o) > 0 {
		t.Errorf("rbac.create=false renders %v", o.kinds())
	}
}

// TestHelmServerDryRun applies every profile's objects to the real API
// server with a server-side dry run: schema errors, unknown fields
// (kubectl validates strictly) and admission failures fail the test.
func TestHelmServerDryRun(t *testing.T) {
	needStack(t)
	installServiceMonitorCRD(t)
	for _, p := range chartProfiles {
		t.Run(p.name, func(t *testing.T) {
			ns := uniq("chart")
			createNamespace(t, ns)
			path := writeFile(t, "rendered.yaml", helm(t, "template", "fs", chartDir, "--namespace", ns, "-f", p.valuesFile(t)))
			out := kubectl(t, "apply", "--dry-run=server", "-f", path)
			for _, k := range p.kinds {
				// "role.rbac.authorization.k8s.io/fs-fleetsync created (server dry run)"
				if !regexp.MustCompile(`(?m)^` + strings.ToLower(k) + `[./]`).MatchString(out) {
					t.Errorf("kubectl apply output does not mention a %s:\n%s", k, out)
				}
			}
		})
	}
}

// TestServerDryRunCatchesSchemaErrors is the control: a misspelt field in
// a rendered Deployment fails the same dry run.
func TestServerDryRunCatchesSchemaErrors(t *testing.T) {
	needStack(t)
	ns := uniq("chart-bad")
	createNamespace(t, ns)
	manifest := helm(t, "template", "fs", chartDir, "--namespace", ns, "-f", chartProfiles[0].valuesFile(t))
	bad := strings.Replace(manifest, "readOnlyRootFilesystem: true", "readOnlyRootFilesytem: true", 1)
	if bad == manifest {
		t.Fatal("manifest has no readOnlyRootFilesystem to misspell")
	}
	r := runCmd(t, filepath.Join(tools, "kubectl"), "--kubeconfig", kube.KubeconfigPath, "apply", "--dry-run=server", "-f", writeFile(t, "bad.yaml", bad))
	if r.code == 0 || !strings.Contains(r.stderr, "readOnlyRootFilesytem") {
		t.Errorf("misspelt field: exit %d, stderr %q; want a failure naming it", r.code, r.stderr)
	}
}

func createNamespace(t *testing.T, ns string) {
	t.Helper()
	_, err := kube.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}

var crdOnce sync.Once

// installServiceMonitorCRD installs a trimmed copy of the Prometheus
// Operator's ServiceMonitor CRD (testdata), with the schema of the fields the
// chart sets, so that the chart's ServiceMonitor can be dry-run too.
func installServiceMonitorCRD(t *testing.T) {
	t.Helper()
	crdOnce.Do(func() {
		b, err := os.ReadFile(filepath.Join("testdata", "servicemonitor-crd.yaml"))
		must(t, err)
		kubectl(t, "apply", "-f", writeFile(t, "crd.yaml", string(b)))
		kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/servicemonitors.monitoring.coreos.com")
		// Discovery caches may lag the Established condition.
		eventually(t, 30*time.Second, "ServiceMonitor kind served", func() error {
			_, err := kube.Client.Discovery().ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
			return err
		})
	})
}
