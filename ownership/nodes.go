package ownership

import (
	"fmt"

	"github.com/fleetsync/fleetsync/consul"
)

// OwnsNode reports an error unless node, as read from Consul, is one of the
// cluster's synthetic nodes (see IsNode) and carries the cluster's node
// mark (meta external-source=kubernetes and k8s-cluster=<id>). A node named
// like ours without the mark is someone else's: purge deletes a node only
// after this check, on the node as read.
func (c Cluster) OwnsNode(node consul.Node) error {
	if !c.IsNode(node.Name) || node.Meta[MetaExternalSource] != ExternalSource || node.Meta[MetaCluster] != c.id {
		return fmt.Errorf("node %s: its meta %s=%q, %s=%q is not cluster %s's mark (%s=%s, %s=%s)",
			node.Name, MetaExternalSource, node.Meta[MetaExternalSource],
			MetaCluster, node.Meta[MetaCluster], c.id,
			MetaExternalSource, ExternalSource, MetaCluster, c.id)
	}
	return nil
}

// ClusterOfNode returns the cluster whose synthetic node node is: node meta
// external-source=kubernetes and k8s-cluster=<id> with a valid id, and a
// name of that cluster's (k8s-<id> or k8s-<id>.<n>). ok is false for every
// other node (consul-k8s's k8s-sync, a node named for another cluster).
func ClusterOfNode(node consul.Node) (c Cluster, ok bool) {
	if node.Meta[MetaExternalSource] != ExternalSource {
		return Cluster{}, false
	}
	c, err := New(node.Meta[MetaCluster])
	if err != nil || c.OwnsNode(node) != nil {
		return Cluster{}, false
	}
	return c, true
}

// Finder tells the consul package's inventory (`fleetsync status`) whose
// node a node is and which claim keys name a cluster id. It implements
// consul.ClusterFinder.
type Finder struct{}

// ClusterOf returns the cluster whose marked node node is (ClusterOfNode).
func (Finder) ClusterOf(node consul.Node) (consul.ClusterOwner, bool) {
	c, ok := ClusterOfNode(node)
	if !ok {
		return nil, false
	}
	return c, true
}

// ValidClusterID reports whether id is a cluster id (ValidateClusterID).
func (Finder) ValidClusterID(id string) bool { return ValidateClusterID(id) == nil }

var (
	_ consul.ClusterOwner  = Cluster{}
	_ consul.ClusterFinder = Finder{}
)
