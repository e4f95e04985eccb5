package consul

// Owner proves ownership and places instances; package ownership's
// Cluster implements it.
type Owner interface {
	// Node is the owner's first node; its Meta marks every node of the
	// owner (the reads list nodes by it).
	Node() Node
	// NodeNameFor names the node a new instance goes on.
	NodeNameFor(instanceID string) string
	// NodeNamed is the owner's node called name, with its mark.
	NodeNamed(name string) Node
	// IsNode reports whether a node of that name is the owner's.
	IsNode(name string) bool
	Stamped(Instance) error
	Owns(Registered) error
}

// ClusterOwner is the Owner of one cluster that also names itself and
// proves a node is its own: package ownership's Cluster. The operator
// reads and deletes (package admin) take one, so that whether a node
// or an entry is a cluster's is decided by package ownership alone.
type ClusterOwner interface {
	Owner
	// ID is the cluster id.
	ID() string
	// NodeName is the name of the cluster's first node.
	NodeName() string
	// OwnsNode returns an error, naming the node and its meta, unless
	// node (as read) is one of the cluster's nodes with its mark.
	OwnsNode(node Node) error
}

// ClusterFinder says whose node a node is and which ids are cluster ids:
// package ownership's Finder.
type ClusterFinder interface {
	// ClusterOf returns the cluster whose marked node node is; false
	// for any other node.
	ClusterOf(node Node) (ClusterOwner, bool)
	// ValidClusterID reports whether id can be a cluster id.
	ValidClusterID(id string) bool
}
