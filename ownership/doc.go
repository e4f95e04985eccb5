// Package ownership holds the cluster's identity and its ownership mark.
//
// It is the only code that can make a Consul instance "ours" (Stamp) or prove
// that one is (Owns). An instance is owned by cluster C when, and only when,
// all of these hold:
//
//   - it is registered on one of C's synthetic nodes: k8s-<C> and, when the
//     cluster is spread over n nodes (WithNodes), k8s-<C>.1 to k8s-<C>.<n-1>
//     (a Service's instances share the node of its namespace/name's hash);
//   - its service meta has external-source=kubernetes and k8s-cluster=<C>;
//   - its tags include <C> (so <C>.<name>.service.consul resolves one cluster).
//
// The consul package's writer is built with an Owner (a Cluster) and refuses
// every write whose instance is not stamped and every delete whose entry, as
// read from Consul, is not owned. There is no way to delete by service name or
// by tag.
//
// A node is cluster C's (OwnsNode) when it has one of C's names and the node
// mark, external-source=kubernetes and k8s-cluster=<C>; a node named like
// C's without the mark is someone else's. ClusterOfNode (and Finder, for the
// consul package's inventory) says which cluster a marked node is. A Cluster
// is immutable and safe for concurrent use.
package ownership
