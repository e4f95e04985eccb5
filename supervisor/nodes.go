package supervisor

import (
	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/ownership"
)

// ServicesPerNode is how many Services one Consul node is meant to hold:
// Consul's cost of a write grows with the services (their checks) already
// on the node it goes to (docs/design/decisions/consul-nodes.md).
const ServicesPerNode = 100

// ChooseNodes returns how many Consul nodes a cluster of selected Services
// spreads over, given the nodes its instances are on now (inUse; 0: none):
// one per ServicesPerNode Services (at least 1, at most
// ownership.MaxNodes), except that the nodes in use are kept while they
// hold between half and twice that on average, so that a cluster whose
// size hovers around a boundary does not move Services back and forth.
// A change of N moves only the Services that must move (a consistent hash,
// see ownership.Cluster.NodeNameFor).
func ChooseNodes(selected, inUse int) int {
	target := min(max(1, (selected+ServicesPerNode-1)/ServicesPerNode), ownership.MaxNodes)
	if inUse >= 1 && inUse <= ownership.MaxNodes && 2*inUse >= target && inUse <= 2*target {
		return inUse
	}
	return target
}

// UsedNodes returns how many nodes the owned entries of a read are spread
// over: the highest node number holding one, plus one (0: none). Every
// entry counts, also one that shares its ID with another on a second node.
func UsedNodes(c ownership.Cluster, entries []consul.Registered) int {
	n := 0
	for i := range entries {
		// Ownership only where it could raise n: most entries cannot.
		if b, ok := c.NodeNumber(entries[i].Node); ok && b+1 > n && c.Owns(entries[i]) == nil {
			n = max(n, b+1)
		}
	}
	return n
}
