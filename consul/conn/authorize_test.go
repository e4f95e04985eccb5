package conn

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/stack"
)

// TestPermissionsAgainstRealConsul: with ACLs off every check passes; with
// ACLs on (default deny), a token whose policy grants node:write but not
// key:write gets ErrNotPermitted naming exactly the key check.
func TestPermissionsAgainstRealConsul(t *testing.T) {
	if agent == nil {
		t.Skip("needs a real Consul agent")
	}
	want := NeededPermissions([]string{"k8s-perm", "k8s-perm.1"}, "fleetsync/clusters/perm")
	ts, _ := NewTokenSource("", "", nil)
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = agent.Addr
	if _, err := NewAPIClient(cfg, ts); err != nil {
		t.Fatal(err)
	}
	if err := Permissions(t.Context(), cfg.HttpClient, cfg, "", want); err != nil {
		t.Fatalf("ACLs off: %v", err)
	}

	acl := stack.ConsulOptionsT(t, stack.ConsulOptions{ACL: true})
	policy, _, err := acl.Client.ACL().PolicyCreate(&api.ACLPolicy{Name: "nodes-only", Rules: `node_prefix "k8s-perm" { policy = "write" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := acl.Client.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: policy.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts2, _ := NewTokenSource(tok.SecretID, "", nil)
	cfg2 := api.DefaultNonPooledConfig()
	cfg2.Address = acl.Addr
	if _, err := NewAPIClient(cfg2, ts2); err != nil {
		t.Fatal(err)
	}
	err = Permissions(t.Context(), cfg2.HttpClient, cfg2, "", want)
	if !errors.Is(err, ErrNotPermitted) || !strings.Contains(err.Error(), `key:write on "fleetsync/clusters/perm"`) || strings.Contains(err.Error(), "node:") {
		t.Fatalf("err %v, want ErrNotPermitted naming the key check alone", err)
	}
}
