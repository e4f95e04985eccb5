package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// aclLogin is a Consul with ACLs on (default deny) and a Kubernetes auth
// method that reviews tokens against the test kube-apiserver, as consul-k8s's
// manageSystemACLs sets it up; fleetsync's ServiceAccount logs in through a
// binding rule to a role with the given rules.
type aclLogin struct {
	consul     *stack.Consul
	admin      *consulapi.Client
	method     string
	sa         string
	bearerFile string
	policyID   string
}

func newACLLogin(t *testing.T, e *env, rules string) *aclLogin {
	t.Helper()
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ACL: true, ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consul log tail:\n%s", own.Agent().LogTail(40))
		}
		_ = own.Stop()
	})
	a := &aclLogin{consul: own, admin: own.Client, method: "fleetsync-k8s-" + e.cluster, sa: "fleetsync"}
	_, err = own.KubernetesAuthMethod(e.ctx, kube, a.method, e.ns)
	must(t, err)
	policy, _, err := a.admin.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: "fleetsync-" + e.cluster, Rules: strings.ReplaceAll(rules, "<cluster-id>", e.cluster)}, nil)
	must(t, err)
	a.policyID = policy.ID
	role, _, err := a.admin.ACL().RoleCreate(&consulapi.ACLRole{Name: "fleetsync-" + e.cluster + "-role", Policies: []*consulapi.ACLRolePolicyLink{{ID: policy.ID}}}, nil)
	must(t, err)
	// consul-k8s binds each component's ServiceAccount to its role so.
	_, _, err = a.admin.ACL().BindingRuleCreate(&consulapi.ACLBindingRule{AuthMethod: a.method, BindType: consulapi.BindingRuleBindTypeRole,
		BindName: role.Name, Selector: fmt.Sprintf("serviceaccount.name==%q and serviceaccount.namespace==%q", a.sa, e.ns)}, nil)
	must(t, err)
	a.bearerFile = filepath.Join(t.TempDir(), "token")
	a.rotate(t, e)
	return a
}

// rotate writes a new ServiceAccount token to the bearer token file (what
// the kubelet does with a projected token), atomically.
func (a *aclLogin) rotate(t *testing.T, e *env) string {
	t.Helper()
	jwt, err := kube.ServiceAccountToken(e.ctx, e.ns, a.sa, time.Hour)
	must(t, err)
	must(t, os.WriteFile(a.bearerFile+".new", []byte(jwt), 0o600))
	must(t, os.Rename(a.bearerFile+".new", a.bearerFile))
	return jwt
}

// loginTokens are the tokens the auth method created that Consul holds.
func (a *aclLogin) loginTokens(t *testing.T) []*consulapi.ACLTokenListEntry {
	t.Helper()
	list, _, err := a.admin.ACL().TokenListFiltered(consulapi.ACLTokenFilterOptions{AuthMethod: a.method}, nil)
	must(t, err)
	return list
}

func (a *aclLogin) spawn(t *testing.T, e *env, args ...string) *fixture.Daemon {
	t.Helper()
	d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: a.consul.Addr, Namespaces: []string{e.ns},
		Args: append([]string{"--consul-login-auth-method=" + a.method, "--consul-login-bearer-token-file=" + a.bearerFile,
			"--consul-login-meta=pod=" + e.ns + "/fleetsync-0"}, args...)})
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleetsync log tail:\n%s", d.LogTail(60))
		}
		d.CloseT(t)
	})
	return d
}

// TestACLLoginKubernetesAuthMethod: fleetsync starts with no token, logs in
// with a ServiceAccount token the API server minted, syncs; when its login
// token is deleted in Consul it logs in again (with the rotated bearer token)
// and the change made meanwhile lands, nothing lost; on shutdown it logs out
// (its token is gone from /v1/acl/tokens); no token shows in its log,
// /debug or /metrics.
func TestACLLoginKubernetesAuthMethod(t *testing.T) {
	e := newEnv(t)
	a := newACLLogin(t, e, aclRules)
	firstJWT, _ := os.ReadFile(a.bearerFile)
	names, keys := svcSet(t, e, "login", 3, 2, 160)
	d := a.spawn(t, e)
	must(t, d.WaitReady(e.ctx, 60*time.Second))
	e.waitCount(a.admin, len(keys), 20*time.Second)
	toks := a.loginTokens(t)
	if len(toks) != 1 {
		t.Fatalf("%d login tokens in Consul, want 1", len(toks))
	}
	first, _, err := a.admin.ACL().TokenRead(toks[0].AccessorID, nil)
	must(t, err)
	if len(first.Roles) != 1 || first.Roles[0].Name != "fleetsync-"+e.cluster+"-role" {
		t.Fatalf("login token roles %+v, want the bound role", first.Roles)
	}
	t.Logf("logged in with the auth method (token %s, role %s); %d instances synced", first.AccessorID, first.Roles[0].Name, len(keys))

	// The token goes (an operator, or its TTL); the bearer token rotates;
	// a change comes in. fleetsync logs in again and the change lands.
	secondJWT := a.rotate(t, e)
	_, err = a.admin.ACL().TokenDelete(first.AccessorID, nil)
	must(t, err)
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[0], "added", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(170, 0, 1))))
	e.waitCount(a.admin, len(keys)+1, 30*time.Second)
	toks = a.loginTokens(t)
	if len(toks) != 1 || toks[0].AccessorID == first.AccessorID {
		t.Fatalf("login tokens after the deletion: %+v, want one new one", toks)
	}
	second, _, err := a.admin.ACL().TokenRead(toks[0].AccessorID, nil)
	must(t, err)
	if !strings.Contains(d.LogTail(400), "logging in again") {
		t.Fatal("no re-login in the log")
	}
	insts, err := fixture.Instances(a.admin, names[0], e.node())
	must(t, err)
	if len(insts) != 3 {
		t.Fatalf("%s has %d instances, want 2 + the added one", names[0], len(insts))
	}

	// No token shows anywhere fleetsync answers or logs.
	var seen []string
	for _, p := range []string{"/debug/workers", "/debug/workers/" + e.ns + "/" + names[0], "/metrics", "/readyz"} {
		_, body, err := d.Get(e.ctx, p, "")
		must(t, err)
		seen = append(seen, body)
	}

	// Shutdown logs out: the token is gone.
	must(t, d.Stop())
	if toks := a.loginTokens(t); len(toks) != 0 {
		t.Fatalf("after shutdown %d login tokens remain (%s), want none", len(toks), toks[0].AccessorID)
	}
	logs, err := os.ReadFile(d.LogPath)
	must(t, err)
	if !strings.Contains(string(logs), "Logged out of Consul") {
		t.Fatal("no logout in the log")
	}
	seen = append(seen, string(logs))
	for _, s := range seen {
		for _, secret := range []string{first.SecretID, second.SecretID, a.consul.Token, string(firstJWT), secondJWT} {
			if strings.Contains(s, secret) {
				t.Fatalf("a token or bearer token appears in fleetsync's output")
			}
		}
	}
	t.Logf("re-login after the token was deleted: the pending change landed (%d instances); logout removed token %s", len(keys)+1, second.AccessorID)
}

// TestACLLoginGrantsTooLittle: a binding rule whose role's policy grants
// too little stops fleetsync at start with an error naming what Consul
// refused and what the policy must grant (no retry loop, nothing written):
// without node:write and key:write the permission check at start names
// both; with them but without session:write the cluster-id claim names
// that. A binding rule that does not select fleetsync's ServiceAccount
// makes the login itself fail, naming the auth method.
func TestACLLoginGrantsTooLittle(t *testing.T) {
	e := newEnv(t)
	const readOnly = `
node_prefix "" { policy = "read" }
service_prefix "" { policy = "write" }
key_prefix "fleetsync/" { policy = "read" }
`
	a := newACLLogin(t, e, readOnly)
	svcSet(t, e, "little", 1, 2, 180)
	stopsWith := func(step string, want ...string) {
		t.Helper()
		d := a.spawn(t, e)
		err := waitExit(t, d, 60*time.Second)
		log := d.LogTail(80)
		for _, w := range append([]string{"binding rules", "The policy must grant"}, want...) {
			if err == nil || !strings.Contains(log, w) {
				t.Fatalf("%s: exit %v; want an error containing %q; log:\n%s", step, err, w, log)
			}
		}
		if n, _, _ := fixture.ClusterServiceCount(a.admin, e.cluster); n != 0 {
			t.Fatalf("%s: %d instances written with a refused policy", step, n)
		}
		t.Logf("%s: %s", step, lastLineWith(log, "lacks"))
	}
	stopsWith("read-only policy", `lacks node:write on "k8s-`+e.cluster+`"`, `key:write on "fleetsync/clusters/`+e.cluster+`"`)

	noSession := `
node "k8s-<cluster-id>" { policy = "write" }
service_prefix "" { policy = "write" }
key_prefix "fleetsync/clusters/" { policy = "write" }
`
	_, _, err := a.admin.ACL().PolicyUpdate(&consulapi.ACLPolicy{ID: a.policyID, Name: "fleetsync-" + e.cluster,
		Rules: strings.ReplaceAll(noSession, "<cluster-id>", e.cluster)}, nil)
	must(t, err)
	stopsWith("no session:write", "Permission denied", "lacks permission 'session:write'")

	// A ServiceAccount no binding rule selects: the login is refused.
	a.sa = "someone-else"
	a.rotate(t, e)
	d2 := a.spawn(t, e)
	err = waitExit(t, d2, 60*time.Second)
	log := d2.LogTail(80)
	if err == nil || !strings.Contains(log, a.method) || !strings.Contains(log, "binding rule") {
		t.Fatalf("exit %v; want a login error naming the auth method; log:\n%s", err, log)
	}
	t.Logf("no binding rule: %s", lastLineWith(log, a.method))
}

// TestOperatorCommandsLogIn: against a Consul with ACLs default-deny and
// no token at all, only the Kubernetes auth method, `fleetsync status`
// logs in from consul-k8s's CONSUL_LOGIN_* variables and `fleetsync purge
// --yes` from the --consul-login-* flags, as the daemon does: status
// shows the cluster the daemon synced, purge removes its instances, node
// and claim; both log out (no login token left). Without a login, purge
// is refused.
func TestOperatorCommandsLogIn(t *testing.T) {
	e := newEnv(t)
	a := newACLLogin(t, e, aclRules)
	_, keys := svcSet(t, e, "oplogin", 2, 2, 165)
	d := a.spawn(t, e)
	must(t, d.WaitReady(e.ctx, 60*time.Second))
	e.waitCount(a.admin, len(keys), 20*time.Second)
	must(t, d.Stop())
	bin, err := fixture.Build()
	must(t, err)
	command := func(env []string, args ...string) (string, error) {
		cmd := exec.CommandContext(e.ctx, bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "CONSUL_") && !strings.HasPrefix(kv, "FLEETSYNC_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	addr := "--consul-address=" + a.consul.Addr

	out, err := command(nil, "purge", "--cluster-id="+e.cluster, addr, "--yes")
	if err == nil {
		t.Fatalf("purge without a token or login succeeded:\n%s", out)
	}
	out, err = command([]string{"CONSUL_LOGIN_AUTH_METHOD=" + a.method, "CONSUL_LOGIN_BEARER_TOKEN_FILE=" + a.bearerFile,
		"CONSUL_LOGIN_META=component=status"}, "status", addr)
	t.Logf("fleetsync status (CONSUL_LOGIN_*):\n%s", out)
	if err != nil || !strings.Contains(out, e.cluster) || !strings.Contains(out, e.node()) {
		t.Fatalf("status: %v; want cluster %s on node %s", err, e.cluster, e.node())
	}
	if toks := a.loginTokens(t); len(toks) != 0 {
		t.Fatalf("status left %d login tokens", len(toks))
	}

	out, err = command(nil, "purge", "--cluster-id="+e.cluster, addr, "--yes",
		"--consul-login-auth-method="+a.method, "--consul-login-bearer-token-file="+a.bearerFile)
	t.Logf("fleetsync purge --yes (--consul-login-*):\n%s", out)
	if err != nil || !strings.Contains(out, fmt.Sprintf("Deregistered %d instances", len(keys))) {
		t.Fatalf("purge: %v; want %d instances deregistered", err, len(keys))
	}
	if n, _ := fixture.NodeServiceCount(a.admin, e.node()); n != 0 {
		t.Fatalf("%d instances left after purge", n)
	}
	if node, _, err := a.admin.Catalog().Node(e.node(), nil); err != nil || node != nil {
		t.Fatalf("node %s after purge: %+v, %v", e.node(), node, err)
	}
	if toks := a.loginTokens(t); len(toks) != 0 {
		t.Fatalf("purge left %d login tokens", len(toks))
	}
}

// TestConsulNamespaceOnOSS: against Consul OSS a non-default namespace
// stops fleetsync at start with an error naming the flag, instead of a
// retry loop; nothing is written.
func TestConsulNamespaceOnOSS(t *testing.T) {
	e := newEnv(t)
	svcSet(t, e, "ns", 1, 1, 190)
	for _, flag := range []string{"--consul-namespace=team-a", "--enable-k8s-namespace-mirroring", "--enable-namespaces", "--consul-partition=part-1"} {
		d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
			ConsulAddr: consul.Addr, Namespaces: []string{e.ns}, Args: []string{flag}})
		must(t, err)
		err = waitExit(t, d, 30*time.Second)
		log := d.LogTail(40)
		d.CloseT(t)
		if err == nil || !strings.Contains(log, "Consul Enterprise") || !strings.Contains(log, strings.SplitN(flag, "=", 2)[0]) {
			t.Fatalf("%s: exit %v; want an error naming the flag; log:\n%s", flag, err, log)
		}
		t.Logf("%s: %s", flag, lastLineWith(log, "Enterprise"))
	}
	if n, _ := fixture.NodeServiceCount(consul.Client, e.node()); n != 0 {
		t.Fatalf("%d instances written", n)
	}
}

// waitExit waits for the daemon to exit on its own and returns its exit
// error (nil: exit 0); it fails t when it still runs after timeout.
func waitExit(t *testing.T, d *fixture.Daemon, timeout time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	select {
	case <-d.Done():
		return d.Wait()
	case <-ctx.Done():
		t.Fatalf("fleetsync still runs after %s; log:\n%s", timeout, d.LogTail(40))
		return nil
	}
}

func lastLineWith(log, s string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}
