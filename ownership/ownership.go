package ownership

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetsync/fleetsync/consul"
)

// Meta keys and values of the ownership mark.
const (
	MetaExternalSource = "external-source"
	MetaCluster        = "k8s-cluster"
	ExternalSource     = "kubernetes"
	NodePrefix         = "k8s-"
)

var clusterIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateClusterID returns an error that says what is allowed when id is not
// a DNS label.
func ValidateClusterID(id string) error {
	if !clusterIDPattern.MatchString(id) {
		return fmt.Errorf("cluster id %q is invalid: it must be a DNS label (1-63 characters: lowercase letters, digits and '-', starting and ending with a letter or digit)", id)
	}
	return nil
}

// Cluster is one Kubernetes cluster's identity in Consul. The zero value is
// not usable; build one with New.
type Cluster struct {
	id    string
	nodes int
	names []string // the name of each node, shared by copies (never written after WithNodes)
}

// MaxNodes bounds WithNodes.
const MaxNodes = 1024

// New returns the identity of cluster id, which must be a DNS label. Its
// instances go on one synthetic node (see WithNodes).
func New(id string) (Cluster, error) {
	if err := ValidateClusterID(id); err != nil {
		return Cluster{}, err
	}
	return Cluster{id: id, nodes: 1, names: []string{NodePrefix + id}}, nil
}

// WithNodes returns c with its instances spread over n synthetic nodes, by
// a consistent hash of namespace/service (see NodeNameFor): node 0 is NodeName(), node b > 0 is
// NodeName()+"."+b (a cluster id has no '.', so no cluster's nodes can be
// taken for another's). Consul's cost of writing a service to a node grows
// with the services already on it; spreading keeps every node small.
func (c Cluster) WithNodes(n int) (Cluster, error) {
	if n < 1 || n > MaxNodes {
		return c, fmt.Errorf("%d Consul nodes per cluster: must be between 1 and %d", n, MaxNodes)
	}
	c.nodes = n
	first := NodePrefix + c.id
	c.names = make([]string, n)
	c.names[0] = first
	for b := 1; b < n; b++ {
		c.names[b] = first + "." + strconv.Itoa(b)
	}
	return c, nil
}

// ID returns the cluster id.
func (c Cluster) ID() string { return c.id }

// Nodes returns how many synthetic nodes new instances are spread over.
func (c Cluster) Nodes() int { return c.nodes }

// NodeName returns the name of the cluster's first synthetic Consul node.
func (c Cluster) NodeName() string {
	if len(c.names) > 0 {
		return c.names[0]
	}
	return NodePrefix + c.id
}

// Node returns the cluster's first synthetic Consul node, carrying the mark.
func (c Cluster) Node() consul.Node { return c.NodeNamed(c.NodeName()) }

// NodeNamed returns the synthetic node called name, carrying the mark.
func (c Cluster) NodeNamed(name string) consul.Node {
	return consul.Node{
		Name:    name,
		Address: "127.0.0.1",
		Meta:    map[string]string{MetaExternalSource: ExternalSource, MetaCluster: c.id},
	}
}

// NodeNameFor names the node a new instance goes on: the bucket of its
// namespace/service, read from the instance ID (see InstanceID), so every
// instance of one Service shares a node. The bucket is a jump consistent
// hash (Lamping and Veach) of namespace/service: going from n to n+1 nodes
// moves only the Services that land on the new node (1/(n+1) of them), and
// from n+1 to n only those of the node that goes. It allocates nothing: the
// diff asks it for every instance.
func (c Cluster) NodeNameFor(instanceID string) string {
	if b := c.bucket(instanceID); b > 0 {
		return c.names[b]
	}
	return c.NodeName()
}

// bucket returns the node number of an instance ID (0 when the ID is not
// one of this cluster's).
func (c Cluster) bucket(instanceID string) int {
	if c.nodes <= 1 {
		return 0
	}
	rest, ok := strings.CutPrefix(instanceID, "k8s_"+c.id+"_")
	if !ok {
		return 0
	}
	ns, rest, ok := strings.Cut(rest, "_")
	if !ok {
		return 0
	}
	name, _, ok := strings.Cut(rest, "_")
	if !ok {
		return 0
	}
	return jumpHash(serviceHash(ns, name), c.nodes)
}

// serviceHash is FNV-1a (64 bits) of namespace + "/" + name.
func serviceHash(ns, name string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(ns); i++ {
		h = (h ^ uint64(ns[i])) * prime
	}
	h = (h ^ '/') * prime
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * prime
	}
	return h
}

// jumpHash maps key to one of n buckets (Lamping and Veach, "A Fast,
// Minimal Memory, Consistent Hash Algorithm", 2014).
func jumpHash(key uint64, n int) int {
	b, j := int64(-1), int64(0)
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}

// NodeNumber returns the number of one of the cluster's nodes (0 for
// NodeName(), b for NodeName()+"."+b); ok is false for any other name.
func (c Cluster) NodeNumber(name string) (n int, ok bool) {
	if name == c.NodeName() {
		return 0, true
	}
	b, ok := strings.CutPrefix(name, c.NodeName()+".")
	if !ok || !isNodeNumber(b) {
		return 0, false
	}
	n, _ = strconv.Atoi(b)
	return n, true
}

// IsNode reports whether name is one of the cluster's synthetic nodes,
// whatever the number of nodes now (instances stay where they were
// written when it changes): NodeName() or NodeName()+"."+n with n exactly
// as NodeNameFor writes it, 1 to MaxNodes-1 in ASCII decimal digits
// without sign or leading zero.
func (c Cluster) IsNode(name string) bool {
	if name == c.NodeName() {
		return true
	}
	b, ok := strings.CutPrefix(name, c.NodeName()+".")
	return ok && isNodeNumber(b)
}

// isNodeNumber reports whether s is the canonical decimal form of a node
// number 1..MaxNodes-1. strconv.Atoi alone would also take "+1".
func isNodeNumber(s string) bool {
	if s == "" || len(s) > len(strconv.Itoa(MaxNodes-1)) || s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	n, err := strconv.Atoi(s)
	return err == nil && n < MaxNodes
}

// Tag returns the ownership tag.
func (c Cluster) Tag() string { return c.id }

// InstanceID derives the deterministic instance ID of one endpoint. Namespace
// and service names cannot contain '_', so the ID is unambiguous.
func (c Cluster) InstanceID(namespace, service, address string, port int) string {
	return "k8s_" + c.id + "_" + namespace + "_" + service + "_" + address + "_" + strconv.Itoa(port)
}

// IDPrefix returns the prefix shared by every instance ID of one Kubernetes
// Service.
func (c Cluster) IDPrefix(namespace, service string) string {
	return "k8s_" + c.id + "_" + namespace + "_" + service + "_"
}

// Stamp returns a copy of inst carrying the ownership mark: the meta pair and
// the tag (appended once, after the user's tags). Values already in inst.Meta
// under the mark's keys are overwritten.
func (c Cluster) Stamp(inst consul.Instance) consul.Instance {
	out := inst
	out.Meta = make(map[string]string, len(inst.Meta)+2)
	maps.Copy(out.Meta, inst.Meta)
	c.StampMeta(out.Meta)
	out.Tags = c.StampTags(inst.Tags)
	return out
}

// StampMeta writes the mark's meta pair into m, which the caller owns
// (Stamp without the copy, for a map built for one instance).
func (c Cluster) StampMeta(m map[string]string) {
	m[MetaExternalSource] = ExternalSource
	m[MetaCluster] = c.id
}

// StampTags returns a copy of tags with the mark's tag appended unless it
// is there: the tags of a stamped instance, computed once per Service
// (each instance takes its own copy).
func (c Cluster) StampTags(tags []string) []string {
	out := slices.Clone(tags)
	if !slices.Contains(out, c.Tag()) {
		out = append(out, c.Tag())
	}
	return out
}

// Stamped reports an error unless inst carries the full mark. The consul
// writer calls it for every instance it is asked to write.
func (c Cluster) Stamped(inst consul.Instance) error {
	if inst.Meta[MetaExternalSource] != ExternalSource || inst.Meta[MetaCluster] != c.id {
		return fmt.Errorf("instance %q lacks the ownership meta of cluster %q", inst.ID, c.id)
	}
	if !slices.Contains(inst.Tags, c.Tag()) {
		return fmt.Errorf("instance %q lacks the ownership tag %q", inst.ID, c.Tag())
	}
	return nil
}

// Owns reports an error unless the entry, as read from Consul, is on one of
// the cluster's nodes and carries the cluster's mark. The consul writer
// calls it for every entry it is asked to update or delete.
func (c Cluster) Owns(r consul.Registered) error {
	if !c.IsNode(r.Node) {
		return fmt.Errorf("instance %q is on node %q, not on a node of cluster %q (%s or %s.<n>)", r.ID, r.Node, c.id, c.NodeName(), c.NodeName())
	}
	if err := c.Stamped(r.Instance); err != nil {
		return fmt.Errorf("entry not owned: %w", err)
	}
	return nil
}
