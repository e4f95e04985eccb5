package consul

import (
	"context"
	"fmt"
	"sort"

	"github.com/hashicorp/consul/api"
)

// Node meta of the ownership mark, as package ownership writes it on every
// cluster's nodes (ownership imports this package, so the keys are
// repeated here; clusters_test.go checks them against the test owner).
const (
	nodeMetaExternalSource = "external-source"
	externalSourceK8s      = "kubernetes"
	nodeMetaCluster        = "k8s-cluster"
)

// ClusterIDs returns the ids of the other Kubernetes clusters in this
// Consul: the distinct, non-empty k8s-cluster node meta values of the nodes
// marked external-source=kubernetes, the owner's own id (its node's
// k8s-cluster meta) left out, sorted. Each is the ownership tag of that
// cluster's instances, so no other cluster may write it as a user tag
// (see worker.Config.ReservedTag). One catalog read
// (/v1/catalog/nodes?node-meta=external-source:kubernetes), bounded by
// Options.MaxReads and Options.RequestTimeout like every read.
func (c *Client) ClusterIDs(ctx context.Context) ([]string, error) {
	if err := c.reads.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	defer c.reads.Release(1)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	q := c.opts.Scope.nodeQuery(&api.QueryOptions{NodeMeta: map[string]string{nodeMetaExternalSource: externalSourceK8s}}).WithContext(rctx)
	nodes, _, err := c.api.CatalogNodes(q)
	if err != nil {
		return nil, fmt.Errorf("list the nodes of Kubernetes clusters (node meta %s=%s): %w", nodeMetaExternalSource, externalSourceK8s, c.ctxErr(ctx, err))
	}
	own := c.owner.Node().Meta[nodeMetaCluster]
	seen := make(map[string]bool)
	var out []string
	for _, n := range nodes {
		if n == nil || n.Meta[nodeMetaExternalSource] != externalSourceK8s {
			continue
		}
		id := n.Meta[nodeMetaCluster]
		if id == "" || id == own || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}
