package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestACLSetup: against a Consul with ACLs on (default deny) and a
// Kubernetes auth method, `fleetsync acl-setup` run with the management
// token creates the policy, role and binding rule, and prints so; fleetsync
// then logs in as its ServiceAccount and syncs, its login token holding the
// role alone, whose policy has exactly the rules the ACL tests grant. Run
// again it changes nothing (the objects' indexes stay); a policy edited by
// hand is put back.
func TestACLSetup(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ACL: true, ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	a := &aclLogin{consul: own, admin: own.Client, method: "consul-k8s-component-auth-method-" + e.cluster, sa: "fleetsync",
		bearerFile: filepath.Join(t.TempDir(), "token")}
	_, err = own.KubernetesAuthMethod(e.ctx, kube, a.method, e.ns)
	must(t, err)
	bin, err := fixture.Build()
	must(t, err)
	setup := func() string {
		t.Helper()
		cmd := exec.CommandContext(e.ctx, bin, "acl-setup", "--cluster-id="+e.cluster, "--auth-method="+a.method,
			"--service-account=fleetsync", "--service-account-namespace="+e.ns)
		cmd.Env = []string{"CONSUL_HTTP_ADDR=" + own.Addr, "CONSUL_HTTP_TOKEN=" + own.Token}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("acl-setup: %v\n%s", err, out)
		}
		return string(out)
	}
	name := "fleetsync-" + e.cluster
	out := setup()
	t.Logf("fleetsync acl-setup:\n%s", out)
	for _, want := range []string{"policy " + name + ": created", "role " + name + ": created",
		"binding rule " + a.method + " -> role " + name + ": created", `key_prefix "fleetsync/clusters/"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	policy, _, err := policyNamed(t, own, name)
	must(t, err)
	if norm(policy.Rules) != norm(strings.ReplaceAll(aclRules, "<cluster-id>", e.cluster)) {
		t.Errorf("policy rules:\n%s\nwant those the ACL tests grant:\n%s", policy.Rules, aclRules)
	}

	// fleetsync logs in with the auth method and syncs.
	a.rotate(t, e)
	_, keys := svcSet(t, e, "setup", 2, 2, 175)
	d := a.spawn(t, e)
	must(t, d.WaitReady(e.ctx, 60*time.Second))
	e.waitCount(own.Client, len(keys), 20*time.Second)
	toks := a.loginTokens(t)
	if len(toks) != 1 {
		t.Fatalf("%d login tokens, want 1", len(toks))
	}
	tok, _, err := own.Client.ACL().TokenRead(toks[0].AccessorID, nil)
	must(t, err)
	if len(tok.Roles) != 1 || tok.Roles[0].Name != name || len(tok.Policies) != 0 || len(tok.ServiceIdentities)+len(tok.NodeIdentities) != 0 {
		t.Errorf("login token: roles %+v, policies %+v; want role %s alone", tok.Roles, tok.Policies, name)
	}

	// Again: nothing changes.
	indexes := func() []uint64 {
		p, _, err := policyNamed(t, own, name)
		must(t, err)
		r, _, err := roleNamed(t, own, name)
		must(t, err)
		b, _, err := own.Client.ACL().BindingRuleList(a.method, nil)
		must(t, err)
		if len(b) != 1 {
			t.Fatalf("%d binding rules, want 1", len(b))
		}
		return []uint64{p.ModifyIndex, r.ModifyIndex, b[0].ModifyIndex}
	}
	before := indexes()
	if out := setup(); strings.Count(out, ": unchanged") != 3 {
		t.Errorf("second run:\n%s\nwant three objects unchanged", out)
	}
	if after := indexes(); after[0] != before[0] || after[1] != before[1] || after[2] != before[2] {
		t.Errorf("indexes %v -> %v: the second run wrote", before, after)
	}

	// A policy edited by hand is put back.
	policy.Rules += `agent_prefix "" { policy = "write" }` + "\n"
	_, _, err = own.Client.ACL().PolicyUpdate(policy, nil)
	must(t, err)
	if out := setup(); !strings.Contains(out, "policy "+name+": updated") || !strings.Contains(out, "role "+name+": unchanged") {
		t.Errorf("after a hand edit:\n%s", out)
	}
	policy, _, err = policyNamed(t, own, name)
	must(t, err)
	if strings.Contains(policy.Rules, "agent_prefix") {
		t.Errorf("hand-added rule kept: %s", policy.Rules)
	}
}

// norm is rules without blank lines, comments and surrounding space.
func norm(rules string) string {
	var out []string
	for _, l := range strings.Split(rules, "\n") {
		l, _, _ = strings.Cut(l, "#")
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// policyNamed and roleNamed read an ACL object by name (a list: Consul
// 1.14 answers a read of a missing name with 403).
func policyNamed(t *testing.T, c *stack.Consul, name string) (*consulapi.ACLPolicy, *consulapi.QueryMeta, error) {
	list, _, err := c.Client.ACL().PolicyList(nil)
	must(t, err)
	for _, p := range list {
		if p.Name == name {
			return c.Client.ACL().PolicyRead(p.ID, nil)
		}
	}
	t.Fatalf("no policy %s", name)
	return nil, nil, nil
}

func roleNamed(t *testing.T, c *stack.Consul, name string) (*consulapi.ACLRole, *consulapi.QueryMeta, error) {
	list, _, err := c.Client.ACL().RoleList(nil)
	must(t, err)
	for _, r := range list {
		if r.Name == name {
			return r, nil, nil
		}
	}
	t.Fatalf("no role %s", name)
	return nil, nil, nil
}
