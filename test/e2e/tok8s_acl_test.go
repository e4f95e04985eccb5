package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestToK8sACL: against a Consul with ACLs on (default deny), a token of
// the role `fleetsync acl-setup` makes without --to-k8s is refused at the
// start of a --to-k8s daemon, naming service:read and node:read (its
// service:write is on the prefix k8s- only); with --to-k8s (the
// policy gains service and node read) the same kind of token mirrors a VM
// service, and the start's permission check passes.
func TestToK8sACL(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ACL: true, ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	bin, err := fixture.Build()
	must(t, err)
	name, svc := "fleetsync-"+e.cluster, e.cluster+"-acl"
	_, err = own.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: e.cluster + "-vm", Address: "10.82.0.1",
		Service: &consulapi.AgentService{ID: "a1", Service: svc, Port: 80}}, nil)
	must(t, err)
	// setup runs acl-setup and returns a token of the role it made.
	setup := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(e.ctx, bin, append([]string{"acl-setup", "--cluster-id=" + e.cluster, "--service-prefix-rule=k8s-"}, args...)...)
		cmd.Env = []string{"CONSUL_HTTP_ADDR=" + own.Addr, "CONSUL_HTTP_TOKEN=" + own.Token}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("acl-setup %v: %v\n%s", args, err, out)
		}
		t.Logf("fleetsync acl-setup %v:\n%s", args, out)
		tok, _, err := own.Client.ACL().TokenCreate(&consulapi.ACLToken{Roles: []*consulapi.ACLTokenRoleLink{{Name: name}}}, nil)
		must(t, err)
		return tok.SecretID
	}
	args := []string{"--to-k8s", "--k8s-write-namespace=" + e.ns, "--to-k8s-allow=" + svc}
	spawn := func(token string) *fixture.Daemon {
		t.Helper()
		d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
			ConsulAddr: own.Addr, Namespaces: []string{e.ns}, Args: args, Env: []string{"CONSUL_HTTP_TOKEN=" + token}})
		must(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("fleetsync log tail:\n%s", d.LogTail(60))
			}
			d.CloseT(t)
		})
		return d
	}

	d := spawn(setup())
	select {
	case <-d.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a --to-k8s daemon whose token cannot read services still runs after 30s")
	}
	if d.Wait() == nil {
		t.Error("the refused daemon exited 0")
	}
	log, err := os.ReadFile(d.LogPath)
	must(t, err)
	for _, want := range []string{`service:read on "fleetsync-to-k8s-read-probe"`, `node:read on "fleetsync-to-k8s-read-probe"`, "fleetsync acl-setup --to-k8s"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the refusal does not say %s:\n%s", want, d.LogTail(20))
		}
	}

	d = spawn(setup("--to-k8s"))
	must(t, d.WaitReady(e.ctx, 60*time.Second))
	e.waitSlices(svc, svc+"-4-80-0[IPv4:80]: 10.82.0.1=true/true/false")
}
