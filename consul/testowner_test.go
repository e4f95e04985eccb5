package consul

import (
	"fmt"
	"slices"
)

// testOwner is a minimal Owner for this package's tests (package ownership
// imports this one, so it cannot be used here).
type testOwner struct{ id string }

func (o testOwner) Node() Node {
	return Node{Name: "k8s-" + o.id, Address: "127.0.0.1", Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": o.id}}
}

func (o testOwner) Stamped(in Instance) error {
	if in.Meta["k8s-cluster"] != o.id || !slices.Contains(in.Tags, o.id) {
		return fmt.Errorf("instance %s not stamped for %s", in.ID, o.id)
	}
	return nil
}

func (o testOwner) Owns(r Registered) error {
	if r.Node != o.Node().Name {
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
