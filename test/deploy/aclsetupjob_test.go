package deploy

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
)

// TestHelmACLSetupJob: aclSetup renders a pre-install/pre-upgrade hook Job
// running `fleetsync acl-setup` (the command TestACLSetup runs against a
// Consul with ACLs and a Kubernetes auth method) for the release's cluster
// id, auth method and ServiceAccount, with the management token's Secret
// mounted and no Kubernetes API access; it passes a server-side dry run; it
// is absent by default and refused without a login.
func TestHelmACLSetupJob(t *testing.T) {
	needStack(t)
	p := profile(t, "minimal")
	p.values += "consul: {address: consul-server.consul:8500, login: {enabled: true, authMethod: consul-consul-k8s-component-auth-method}}\n"
	if o := p.render(t, "fs", "fleetsync"); len(o.ofKind("Job")) != 0 {
		t.Fatal("an acl-setup Job without aclSetup.enabled")
	}
	p.values += "aclSetup: {enabled: true, managementTokenSecret: {name: consul-bootstrap-acl-token}}\n"
	ns := uniq("aclsetup")
	o := p.render(t, "fs", ns)
	var job batchv1.Job
	o.one(t, "Job", &job)
	pod := job.Spec.Template.Spec
	c := pod.Containers[0]
	if h := job.Annotations["helm.sh/hook"]; h != "pre-install,pre-upgrade" {
		t.Errorf("hook %q", h)
	}
	want := []string{"acl-setup", "--cluster-id=prod-eu-1", "--auth-method=consul-consul-k8s-component-auth-method",
		"--service-account=fs-fleetsync", "--service-account-namespace=" + ns, "--consul-token-file=/etc/fleetsync/consul-management/token"}
	if !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	var sa string
	for _, x := range o.ofKind("ServiceAccount") {
		sa = x.GetName()
	}
	if sa != "fs-fleetsync" {
		t.Errorf("the chart's ServiceAccount is %q, the Job binds fs-fleetsync", sa)
	}
	if len(pod.Volumes) != 1 || pod.Volumes[0].Secret == nil || pod.Volumes[0].Secret.SecretName != "consul-bootstrap-acl-token" ||
		pod.Volumes[0].Secret.Items[0].Key != "token" || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("volumes %+v, automount %v", pod.Volumes, pod.AutomountServiceAccountToken)
	}
	createNamespace(t, ns)
	out := kubectl(t, "apply", "--dry-run=server", "-f", writeFile(t, "job.yaml", o.only("Job").yaml(t)))
	if !strings.Contains(out, "job.batch/fs-fleetsync-acl-setup created (server dry run)") {
		t.Errorf("dry run: %s", out)
	}

	noLogin := profile(t, "minimal")
	noLogin.values += "aclSetup: {enabled: true, managementTokenSecret: {name: t}}\n"
	r := runCmd(t, filepath.Join(tools, "helm"), "template", "fs", chartDir, "-f", noLogin.valuesFile(t))
	if r.code == 0 || !strings.Contains(r.stderr, "aclSetup.enabled needs consul.login.enabled") {
		t.Errorf("aclSetup without login: exit %d, stderr %q", r.code, r.stderr)
	}
}
