package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

const cleanupValues = "cleanupOnUninstall: {enabled: true}\nconsul: {address: consul-server.consul:8500, tokenSecret: {name: fleetsync-consul-token, key: token}}\n"

// cleanupJob renders the chart with the cleanup hook and returns its Job.
func cleanupJob(t *testing.T, ns string) (batchv1.Job, objects) {
	t.Helper()
	p := profile(t, "minimal")
	p.values += cleanupValues
	o := p.render(t, "fs", ns)
	var job batchv1.Job
	o.one(t, "Job", &job)
	return job, o
}

// TestHelmCleanupJob: cleanupOnUninstall renders a post-delete hook Job
// that runs purge for the release's cluster id with the daemon's Consul
// token, without Kubernetes API access; it passes a server-side dry run;
// it is absent by default and refused with a login (purge has none).
func TestHelmCleanupJob(t *testing.T) {
	needStack(t)
	if o := profile(t, "minimal").render(t, "fs", "fleetsync"); len(o.ofKind("Job")) != 0 {
		t.Fatal("a cleanup Job without cleanupOnUninstall.enabled")
	}
	ns := uniq("cleanup")
	job, o := cleanupJob(t, ns)
	pod := job.Spec.Template.Spec
	c := pod.Containers[0]
	if a := job.Annotations; a["helm.sh/hook"] != "post-delete" || !strings.Contains(a["helm.sh/hook-delete-policy"], "hook-succeeded") {
		t.Errorf("hook annotations %v", a)
	}
	if want := []string{"purge", "--cluster-id=prod-eu-1", "--yes", "--wait-released=2m"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["CONSUL_HTTP_ADDR"] != "consul-server.consul:8500" || env["CONSUL_HTTP_TOKEN_FILE"] != "/etc/fleetsync/consul-token/token" {
		t.Errorf("env %v", env)
	}
	if len(pod.Volumes) != 1 || pod.Volumes[0].Secret == nil || pod.Volumes[0].Secret.SecretName != "fleetsync-consul-token" ||
		len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/etc/fleetsync/consul-token" {
		t.Errorf("volumes %+v, mounts %+v", pod.Volumes, c.VolumeMounts)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken || pod.RestartPolicy != "Never" {
		t.Errorf("pod: automount %v, restart %q; want no API token, Never", pod.AutomountServiceAccountToken, pod.RestartPolicy)
	}
	createNamespace(t, ns)
	out := kubectl(t, "apply", "--dry-run=server", "-f", writeFile(t, "job.yaml", o.only("Job").yaml(t)))
	if !strings.Contains(out, "job.batch/fs-fleetsync-cleanup created (server dry run)") {
		t.Errorf("dry run: %s", out)
	}

	login := profile(t, "minimal")
	login.values += "cleanupOnUninstall: {enabled: true}\nconsul: {address: c:8500, login: {enabled: true, authMethod: k8s}}\n"
	r := runCmd(t, filepath.Join(tools, "helm"), "template", "fs", chartDir, "-f", login.valuesFile(t))
	if r.code == 0 || !strings.Contains(r.stderr, "cleanupOnUninstall.enabled needs a static token") {
		t.Errorf("login and cleanup: exit %d, stderr %q; want a refusal", r.code, r.stderr)
	}
}

// TestCleanupJobCommand runs the cleanup Job's command, as rendered, against
// the real stack, as an uninstall does: started while the cluster's
// fleetsync still runs (its pods stopping), it waits; once fleetsync has
// stopped it removes the cluster's instances, node and claim, and nothing
// of another cluster.
func TestCleanupJobCommand(t *testing.T) {
	needStack(t)
	consul := stack.ConsulT(t)
	bin, err := fixture.Build()
	must(t, err)
	ctx := t.Context()
	ns, other := uniq("cleanup-x"), uniq("cleanup-y")
	createNamespace(t, ns)
	createNamespace(t, other)
	x, y := uniq("x"), uniq("y")
	start := func(cluster, ns string) *fixture.Daemon {
		d, err := fixture.StartDaemon(ctx, fixture.DaemonConfig{ClusterID: cluster, Kubeconfig: kube.KubeconfigPath,
			ConsulAddr: consul.Addr, Namespaces: []string{ns}})
		must(t, err)
		t.Cleanup(func() { d.CloseT(t) })
		return d
	}
	dX := start(x, ns)
	start(y, other)
	ports := map[string]int32{"http": 80}
	ann := map[string]string{"consul.hashicorp.com/service-sync": "true"}
	for _, n := range []string{ns, other} {
		must(t, fixture.ApplyService(ctx, kube.Client, fixture.Service(n, "web", ann, ports)))
		must(t, fixture.ApplySlice(ctx, kube.Client, fixture.Slice(n, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 2))))
	}
	for _, node := range []string{"k8s-" + x, "k8s-" + y} {
		eventually(t, 20*time.Second, "2 instances on "+node, func() error { return wantNodeEntries(consul, node, 2) })
	}

	job, _ := cleanupJob(t, ns)
	c := job.Spec.Template.Spec.Containers[0]
	args := slices.Clone(c.Args)
	args[1] = "--cluster-id=" + x // the release's cluster id is the test's
	cmdCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cmdCtx, bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "CONSUL_HTTP_ADDR=" + consul.Addr} // the Job's CONSUL_HTTP_ADDR, here
	purge, err := fixture.StartCommand(cmd)
	must(t, err)
	purge.WaitLine("Waiting up to 2m0s for the fleetsync holding cluster id " + x)
	if err := wantNodeEntries(consul, "k8s-"+x, 2); err != nil {
		t.Fatalf("purge did not wait for the running fleetsync: %v\n%s", err, purge.Output())
	}
	must(t, dX.Close()) // the Deployment's pods stop
	out, err := purge.Wait()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("fleetsync %s:\n%s", strings.Join(args, " "), out)
	for _, want := range []string{"Deregistered 2 instances of 1 services", "Deregistered node k8s-" + x, "Removed claim fleetsync/clusters/" + x} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n, _, err := consul.Client.Catalog().Node("k8s-"+x, nil); err != nil || n != nil {
		t.Errorf("node k8s-%s after the cleanup: %+v, %v", x, n, err)
	}
	if err := wantNodeEntries(consul, "k8s-"+y, 2); err != nil {
		t.Errorf("the other cluster: %v", err)
	}
}

// wantNodeEntries checks that node holds n service entries.
func wantNodeEntries(consul *stack.Consul, node string, n int) error {
	got, err := fixture.NodeServiceCount(consul.Client, node)
	if err == nil && got != n {
		err = fmt.Errorf("%s holds %d entries, want %d", node, got, n)
	}
	return err
}
