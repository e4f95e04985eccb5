package consul

import (
	"context"
	"errors"
	"strings"

	"github.com/hashicorp/consul/api"
)

// NamespaceEnsurer makes sure a Consul namespace exists before the first
// write into it (package consul/namespaces): Ensure returns nil once it
// does; Forget makes the next Ensure ask Consul again.
type NamespaceEnsurer interface {
	Ensure(ctx context.Context, ns string) error
	Forget(ns string)
}

// writeNamespaces are the namespaces groups register or update instances
// in, each once, in order.
func writeNamespaces(groups []group) []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range groups {
		for _, op := range g.ops {
			if op.Service == nil || op.Service.Verb != api.ServiceCAS {
				continue
			}
			if ns := op.Service.Service.Namespace; ns != "" && !seen[ns] {
				seen[ns] = true
				out = append(out, ns)
			}
		}
	}
	return out
}

// ensureNamespaces makes the namespaces groups write into exist
// (Options.Namespaces; nothing without it).
func (c *Client) ensureNamespaces(ctx context.Context, groups []group) error {
	if c.opts.Namespaces == nil {
		return nil
	}
	for _, ns := range writeNamespaces(groups) {
		if err := c.opts.Namespaces.Ensure(ctx, ns); err != nil {
			return err
		}
	}
	return nil
}

// namespaceGone forgets the namespaces of groups when a transaction of
// theirs failed because a namespace does not exist (deleted, or Consul lost
// its data since it was ensured): the next Apply creates it again.
func (c *Client) namespaceGone(err error, groups []group) {
	var te *TxnError
	if c.opts.Namespaces == nil || !errors.As(err, &te) {
		return
	}
	for _, x := range te.Errors {
		w := strings.ToLower(x.What)
		if strings.Contains(w, "namespace") && (strings.Contains(w, "not exist") || strings.Contains(w, "not found")) {
			for _, ns := range writeNamespaces(groups) {
				c.opts.Namespaces.Forget(ns)
			}
			return
		}
	}
}
