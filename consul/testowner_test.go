package consul

import (
	"fmt"
	"slices"
)

// testOwner is a minimal Owner for this package's tests (package ownership
// imports this one, so it cannot be used here).
// With spread, instances whose ID ends in an odd digit go on a second node,
// k8s-<id>.1.
type testOwner struct {
	id     string
	spread bool
}

func (o testOwner) Node() Node { return o.NodeNamed("k8s-" + o.id) }

func (o testOwner) NodeNamed(name string) Node {
	return Node{Name: name, Address: "127.0.0.1", Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": o.id}}
}

func (o testOwner) NodeNameFor(id string) string {
	if o.spread && id != "" && (id[len(id)-1]-'0')%2 == 1 {
		return o.Node().Name + ".1"
	}
	return o.Node().Name
}

func (o testOwner) IsNode(name string) bool {
	return name == o.Node().Name || name == o.Node().Name+".1"
}

func (o testOwner) Stamped(in Instance) error {
	if in.Meta["k8s-cluster"] != o.id || !slices.Contains(in.Tags, o.id) {
		return fmt.Errorf("instance %s not stamped for %s", in.ID, o.id)
	}
	return nil
}

func (o testOwner) Owns(r Registered) error {
	if !o.IsNode(r.Node) {
		return fmt.Errorf("instance %s on node %s", r.ID, r.Node)
	}
	return o.Stamped(r.Instance)
}

func (o testOwner) instance(i int, name string) Instance {
	return Instance{
		ID: fmt.Sprintf("%s-%s-%d", o.id, name, i), Name: name, Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Port: 80,
		Tags: []string{"k8s", o.id}, Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": o.id},
		Check: Check{Status: StatusPassing, Output: "ready"},
	}
}
