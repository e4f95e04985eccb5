package aclsetup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"
)

// Config says for which cluster, and how fleetsync gets its token.
type Config struct {
	ClusterID   string // the --cluster-id
	ClaimPrefix string // the --claim-prefix (KV prefix of the cluster-id claims)
	// ServicePrefix narrows service:write to the Consul names starting with
	// it ("" : every name, as synced Services may be named anything).
	ServicePrefix string
	// AuthMethod, when set, is the Kubernetes auth method fleetsync logs in
	// with (--consul-login-auth-method); ServiceAccount and Namespace are
	// fleetsync's ServiceAccount, which the binding rule selects.
	AuthMethod, ServiceAccount, Namespace string
	// ToK8s adds what the Consul -> Kubernetes direction reads (--to-k8s,
	// --to-k8s-import): every service's instances and health, every
	// node's address.
	ToK8s bool
}

// Change is one object Apply looked at: Kind (policy, role, binding rule),
// Name, and Action (created, updated, unchanged).
type Change struct {
	Kind, Name, Action string
}

func (c Change) String() string { return fmt.Sprintf("%s %s: %s", c.Kind, c.Name, c.Action) }

// Name is the policy's and the role's name.
func (cfg Config) Name() string { return "fleetsync-" + cfg.ClusterID }

// Selector is the binding rule's selector: fleetsync's ServiceAccount.
func (cfg Config) Selector() string {
	return fmt.Sprintf("serviceaccount.name==%q and serviceaccount.namespace==%q", cfg.ServiceAccount, cfg.Namespace)
}

// Rules are the policy's rules: write on the cluster's nodes (k8s-<id>,
// and k8s-<id>.<n> when its instances are spread), on the synced service
// names, on sessions (the claim's, tied to the agent's node) and on the
// claim keys (fleetsync reads the other clusters' claims there too); with
// ToK8s, read of every service and node (write on the synced names, when
// they are every name, includes it).
func Rules(cfg Config) string {
	node := "k8s-" + cfg.ClusterID
	rules := fmt.Sprintf(`node %q { policy = "write" }
node_prefix %q { policy = "write" }
service_prefix %q { policy = "write" }
session_prefix "" { policy = "write" }
key_prefix %q { policy = "write" }
`, node, node+".", cfg.ServicePrefix, strings.TrimSuffix(cfg.ClaimPrefix, "/")+"/")
	if cfg.ToK8s {
		if cfg.ServicePrefix != "" {
			rules += `service_prefix "" { policy = "read" }` + "\n"
		}
		rules += `node_prefix "" { policy = "read" }` + "\n"
	}
	return rules
}

// Validate reports a Config Apply cannot use.
func (cfg Config) Validate() error {
	switch {
	case cfg.ClusterID == "":
		return errors.New("the cluster id is required")
	case strings.Trim(cfg.ClaimPrefix, "/") == "":
		return errors.New("the claim prefix is required")
	case cfg.AuthMethod != "" && (cfg.ServiceAccount == "" || cfg.Namespace == ""):
		return errors.New("a binding rule needs the ServiceAccount's name and namespace")
	}
	return nil
}

// Apply makes the policy, the role and (with an auth method) the binding
// rule what cfg wants, with client's (management) token.
func Apply(ctx context.Context, client *api.Client, cfg Config) ([]Change, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	acl := client.ACL()
	q, w := (&api.QueryOptions{}).WithContext(ctx), (&api.WriteOptions{}).WithContext(ctx)
	if cfg.AuthMethod != "" {
		m, _, err := acl.AuthMethodRead(cfg.AuthMethod, q)
		if err != nil {
			return nil, fmt.Errorf("read auth method %s: %w", cfg.AuthMethod, err)
		}
		if m == nil {
			return nil, fmt.Errorf("auth method %s does not exist (consul-k8s's manageSystemACLs creates <release>-consul-k8s-component-auth-method)", cfg.AuthMethod)
		}
	}
	var changes []Change
	policy, ch, err := ensurePolicy(acl, cfg, q, w)
	if err != nil {
		return changes, err
	}
	changes = append(changes, ch)
	ch, err = ensureRole(acl, cfg, policy, q, w)
	if err != nil {
		return changes, err
	}
	changes = append(changes, ch)
	if cfg.AuthMethod == "" {
		return changes, nil
	}
	ch, err = ensureBindingRule(acl, cfg, q, w)
	return append(changes, ch), err
}

func ensurePolicy(acl *api.ACL, cfg Config, q *api.QueryOptions, w *api.WriteOptions) (*api.ACLPolicy, Change, error) {
	ch := Change{Kind: "policy", Name: cfg.Name(), Action: "unchanged"}
	want := &api.ACLPolicy{Name: cfg.Name(), Rules: Rules(cfg), Description: "fleetsync of cluster " + cfg.ClusterID + " (fleetsync acl-setup)"}
	have, err := policyNamed(acl, want.Name, q)
	if err != nil {
		return nil, ch, err
	}
	switch {
	case have == nil:
		ch.Action = "created"
		have, _, err = acl.PolicyCreate(want, w)
	case have.Rules != want.Rules || len(have.Datacenters) > 0:
		ch.Action = "updated"
		want.ID = have.ID
		have, _, err = acl.PolicyUpdate(want, w)
	}
	if err != nil {
		return nil, ch, fmt.Errorf("%s policy %s: %w", strings.TrimSuffix(ch.Action, "d"), want.Name, err)
	}
	return have, ch, nil
}

func ensureRole(acl *api.ACL, cfg Config, policy *api.ACLPolicy, q *api.QueryOptions, w *api.WriteOptions) (Change, error) {
	ch := Change{Kind: "role", Name: cfg.Name(), Action: "unchanged"}
	want := &api.ACLRole{Name: cfg.Name(), Description: "fleetsync of cluster " + cfg.ClusterID + " (fleetsync acl-setup)",
		Policies: []*api.ACLRolePolicyLink{{ID: policy.ID, Name: policy.Name}}}
	have, err := roleNamed(acl, want.Name, q)
	if err != nil {
		return ch, err
	}
	switch {
	case have == nil:
		ch.Action = "created"
		_, _, err = acl.RoleCreate(want, w)
	case len(have.Policies) != 1 || have.Policies[0].ID != policy.ID || len(have.ServiceIdentities)+len(have.NodeIdentities) > 0:
		ch.Action = "updated"
		want.ID = have.ID
		_, _, err = acl.RoleUpdate(want, w)
	}
	if err != nil {
		return ch, fmt.Errorf("%s role %s: %w", strings.TrimSuffix(ch.Action, "d"), want.Name, err)
	}
	return ch, nil
}

// ensureBindingRule keeps one rule of the auth method binding the role:
// an existing one with another selector is updated, a second one deleted.
func ensureBindingRule(acl *api.ACL, cfg Config, q *api.QueryOptions, w *api.WriteOptions) (Change, error) {
	ch := Change{Kind: "binding rule", Name: cfg.AuthMethod + " -> role " + cfg.Name(), Action: "unchanged"}
	rules, _, err := acl.BindingRuleList(cfg.AuthMethod, q)
	if err != nil {
		return ch, fmt.Errorf("list binding rules of %s: %w", cfg.AuthMethod, err)
	}
	want := &api.ACLBindingRule{AuthMethod: cfg.AuthMethod, BindType: api.BindingRuleBindTypeRole, BindName: cfg.Name(),
		Selector: cfg.Selector(), Description: "fleetsync of cluster " + cfg.ClusterID + " (fleetsync acl-setup)"}
	ours := slices.DeleteFunc(slices.Clone(rules), func(r *api.ACLBindingRule) bool {
		return r.BindType != api.BindingRuleBindTypeRole || r.BindName != want.BindName
	})
	switch {
	case len(ours) == 0:
		ch.Action = "created"
		_, _, err = acl.BindingRuleCreate(want, w)
	case ours[0].Selector != want.Selector:
		ch.Action = "updated"
		want.ID = ours[0].ID
		_, _, err = acl.BindingRuleUpdate(want, w)
	}
	for _, extra := range ours[min(1, len(ours)):] {
		if err == nil {
			ch.Action = "updated"
			_, err = acl.BindingRuleDelete(extra.ID, w)
		}
	}
	if err != nil {
		return ch, fmt.Errorf("binding rule of %s for role %s: %w", cfg.AuthMethod, want.BindName, err)
	}
	return ch, nil
}

// policyNamed reads the policy called name, nil when there is none. It
// lists rather than reads by name: Consul before 1.15 answers a read of a
// missing name with 403 "ACL not found", as it does for an unknown token.
func policyNamed(acl *api.ACL, name string, q *api.QueryOptions) (*api.ACLPolicy, error) {
	list, _, err := acl.PolicyList(q)
	if err != nil {
		return nil, fmt.Errorf("list policies: %w", err)
	}
	for _, p := range list {
		if p.Name == name {
			full, _, err := acl.PolicyRead(p.ID, q)
			if err != nil {
				return nil, fmt.Errorf("read policy %s: %w", name, err)
			}
			return full, nil
		}
	}
	return nil, nil
}

// roleNamed reads the role called name, nil when there is none (see
// policyNamed).
func roleNamed(acl *api.ACL, name string, q *api.QueryOptions) (*api.ACLRole, error) {
	list, _, err := acl.RoleList(q)
	if err != nil {
		return nil, fmt.Errorf("list roles: %w", err)
	}
	for _, r := range list {
		if r.Name == name {
			return r, nil
		}
	}
	return nil, nil
}
