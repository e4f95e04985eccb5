package ownership

import (
	"strings"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
)

func TestClusterOfNode(t *testing.T) {
	mark := func(id string) map[string]string {
		return map[string]string{MetaExternalSource: ExternalSource, MetaCluster: id}
	}
	cases := []struct {
		name string
		node consul.Node
		want string // "" when not a fleetsync cluster node
	}{
		{"fleetsync node", consul.Node{Name: "k8s-east", Meta: mark("east")}, "east"},
		{"fleetsync spread node", consul.Node{Name: "k8s-east.3", Meta: mark("east")}, "east"},
		{"consul-k8s node", consul.Node{Name: "k8s-sync", Meta: map[string]string{MetaExternalSource: ExternalSource}}, ""},
		{"name does not match the id", consul.Node{Name: "k8s-west", Meta: mark("east")}, ""},
		{"not a node number", consul.Node{Name: "k8s-east.01", Meta: mark("east")}, ""},
		{"invalid id", consul.Node{Name: "k8s-East", Meta: mark("East")}, ""},
		{"other source", consul.Node{Name: "k8s-east", Meta: map[string]string{MetaExternalSource: "nomad", MetaCluster: "east"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ClusterOfNode(c.node)
			if ok != (c.want != "") || (ok && got.ID() != c.want) {
				t.Errorf("ClusterOfNode = %q, %t; want %q", got.ID(), ok, c.want)
			}
			owner, ok := Finder{}.ClusterOf(c.node)
			if ok != (c.want != "") || (ok && owner.ID() != c.want) || (!ok && owner != nil) {
				t.Errorf("Finder.ClusterOf = %v, %t; want %q", owner, ok, c.want)
			}
		})
	}
	if !(Finder{}).ValidClusterID("east") || (Finder{}).ValidClusterID("East") {
		t.Error("Finder.ValidClusterID disagrees with ValidateClusterID")
	}
}

// TestOwnsNode: a node is the cluster's only with one of its names and its
// full node mark; a refusal names the node, its meta and the mark wanted.
func TestOwnsNode(t *testing.T) {
	east, _ := New("east")
	ours := map[string]string{MetaExternalSource: ExternalSource, MetaCluster: "east"}
	for _, name := range []string{"k8s-east", "k8s-east.1", "k8s-east.1023"} {
		if err := east.OwnsNode(consul.Node{Name: name, Meta: ours}); err != nil {
			t.Errorf("%s with our mark: %v", name, err)
		}
	}
	if err := east.OwnsNode(east.Node()); err != nil {
		t.Errorf("the node Node() returns: %v", err)
	}
	for _, n := range []consul.Node{
		{Name: "k8s-east", Meta: map[string]string{MetaExternalSource: ExternalSource, MetaCluster: "west"}},
		{Name: "k8s-east", Meta: map[string]string{MetaExternalSource: ExternalSource}},
		{Name: "k8s-east", Meta: map[string]string{MetaCluster: "east"}},
		{Name: "k8s-east"},
		{Name: "k8s-west", Meta: ours},
		{Name: "k8s-east.01", Meta: ours},
		{Name: "k8s-east.1024", Meta: ours},
	} {
		err := east.OwnsNode(n)
		if err == nil {
			t.Errorf("%s with meta %v: owned", n.Name, n.Meta)
			continue
		}
		want := "node " + n.Name + ": its meta external-source=\"" + n.Meta[MetaExternalSource] + "\", k8s-cluster=\"" + n.Meta[MetaCluster] +
			"\" is not cluster east's mark (external-source=kubernetes, k8s-cluster=east)"
		if err.Error() != want {
			t.Errorf("%s: err %q, want %q", n.Name, err, want)
		}
	}
	if strings.Contains(east.OwnsNode(consul.Node{Name: "k8s-east"}).Error(), "refusing") {
		t.Error("the wording of a refusal is the caller's")
	}
}
