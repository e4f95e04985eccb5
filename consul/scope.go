package consul

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/conn"
)

// Scope is where in Consul the instances live: a namespace and an admin
// partition (both Consul Enterprise), or, with MirrorNamespaces, the Consul
// namespace named like each instance's Kubernetes namespace (with
// MirrorPrefix before it), as consul-k8s's -enable-k8s-namespace-mirroring
// does. The zero Scope is Consul OSS's: no namespace, no partition, and no
// ns or partition parameter in any request.
//
// Every transaction op carries the namespace and the partition (node ops
// the partition); every read asks for them (with mirroring, reads of a
// node's or a service's instances ask for every namespace, ns=*); the
// cluster-id claim's key, its session and its guard op are in Namespace
// and Partition. The datacenter is the client's (api.Config.Datacenter):
// consul/api puts it on every request.
type Scope struct {
	Namespace        string
	Partition        string
	MirrorNamespaces bool
	MirrorPrefix     string
}

// metaK8sNamespace is the service meta key holding the Kubernetes namespace
// (worker.MetaNamespace; repeated here, checked in scope_test.go).
const metaK8sNamespace = "k8s-namespace"

// Normal treats "default" as no namespace or partition (what Consul OSS
// understands, and what Enterprise means by none).
func (s Scope) Normal() Scope {
	if s.Namespace == "default" {
		s.Namespace = ""
	}
	if s.Partition == "default" {
		s.Partition = ""
	}
	return s
}

// Enterprise reports whether the scope needs Consul Enterprise.
func (s Scope) Enterprise() bool {
	s = s.Normal()
	return s.Namespace != "" || s.Partition != "" || s.MirrorNamespaces
}

// NamespaceOf is the Consul namespace of an instance ("" for the default).
func (s Scope) NamespaceOf(in Instance) string {
	s = s.Normal()
	if s.MirrorNamespaces {
		if ns := in.Meta[metaK8sNamespace]; ns != "" {
			return s.MirrorPrefix + ns
		}
	}
	return s.Namespace
}

// readNamespace is the ns of reads of instances: every namespace when
// mirroring (the instances of one node or name may be in several).
func (s Scope) readNamespace() string {
	s = s.Normal()
	if s.MirrorNamespaces {
		return "*"
	}
	return s.Namespace
}

// instanceQuery is a read of instances.
func (s Scope) instanceQuery(q *api.QueryOptions) *api.QueryOptions {
	q.Namespace, q.Partition = s.readNamespace(), s.Normal().Partition
	return q
}

// nodeQuery is a read of nodes (nodes are in a partition, not a namespace).
func (s Scope) nodeQuery(q *api.QueryOptions) *api.QueryOptions {
	q.Partition = s.Normal().Partition
	return q
}

// kvQuery is a read of a KV key (Client.KVIndex).
func (s Scope) kvQuery(q *api.QueryOptions) *api.QueryOptions {
	n := s.Normal()
	q.Namespace, q.Partition = n.Namespace, n.Partition
	return q
}

// CheckScope asks Consul once for the scope's namespace and partition (a
// read of the owner's node services) and explains a Consul that cannot
// have them (Consul OSS answers 400 "... Consul Enterprise feature"), so
// that fleetsync stops at start with the flag to fix instead of retrying.
// A zero scope sends nothing.
func (c *Client) CheckScope(ctx context.Context) error {
	s := c.opts.Scope.Normal()
	if !s.Enterprise() {
		return nil
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	q := s.instanceQuery(&api.QueryOptions{Filter: `ID == "" and ID != ""`})
	if s.MirrorNamespaces && q.Namespace == "*" {
		// Ask for a namespace the mirroring would use, so that Consul
		// OSS (which ignores no ns at all) says no.
		q.Namespace = s.MirrorPrefix + "default"
	}
	_, _, err := c.api.NodeServiceList(c.owner.Node().Name, q.WithContext(rctx))
	if err == nil {
		return nil
	}
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusBadRequest && strings.Contains(strings.ToLower(se.Body), "enterprise") {
		var flags []string
		if s.Namespace != "" {
			flags = append(flags, fmt.Sprintf("--consul-namespace=%s", s.Namespace))
		}
		if s.Partition != "" {
			flags = append(flags, fmt.Sprintf("--consul-partition=%s", s.Partition))
		}
		if s.MirrorNamespaces {
			flags = append(flags, "--enable-k8s-namespace-mirroring (on by default with --enable-namespaces)")
		}
		return fmt.Errorf("%w: this Consul refuses %s (%s); remove the flag(s) for Consul OSS, or use the default namespace and partition", conn.ErrEnterpriseOnly, strings.Join(flags, " "), se.Body)
	}
	return fmt.Errorf("check the Consul namespace and partition: %w", c.ctxErr(ctx, err))
}
