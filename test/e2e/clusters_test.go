package e2e

import (
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// TestTwoClustersShareOneConsul: two daemons with different cluster ids (each
// watching its own namespace of the one API server) sync a Service of the
// same Consul name with different endpoints. Each keeps its own instances
// exact; neither touches the other's, nor an instance registered by hand on
// another node, nor an unmarked instance on its own node.
func TestTwoClustersShareOneConsul(t *testing.T) {
	a, b := newEnv(t), newEnv(t)
	ctx, c := a.ctx, kube.Client
	ports := map[string]int32{"http": 80}
	ann := map[string]string{optIn: "true", "consul.hashicorp.com/service-name": "shared"}

	// Foreign entries: a hand-registered instance on another node, and an
	// unmarked one on a's node.
	hand := &consulapi.CatalogRegistration{Node: "hand-node", Address: "127.0.0.9",
		Service: &consulapi.AgentService{ID: "shared-by-hand", Service: "shared", Address: "192.168.0.1", Port: 80, Tags: []string{a.cluster}}}
	_, err := consul.Client.Catalog().Register(hand, nil)
	must(t, err)
	// (The node carries a's mark, as if a created it: a node with a's name
	// and without the mark is someone else's, and never written; see
	// TestLookAlikeNodeIsNeverWritten.)
	unmarked := &consulapi.CatalogRegistration{Node: a.node(), Address: "127.0.0.1",
		NodeMeta: map[string]string{"external-source": "kubernetes", "k8s-cluster": a.cluster},
		Service:  &consulapi.AgentService{ID: "shared-unmarked", Service: "shared", Address: "192.168.0.2", Port: 80}}
	_, err = consul.Client.Catalog().Register(unmarked, nil)
	must(t, err)
	foreign := foreignIndexes(t)

	a.daemon()
	b.daemon()
	must(t, fixture.ApplyService(ctx, c, fixture.Service(a.ns, "web", ann, ports)))
	must(t, fixture.ApplyService(ctx, c, fixture.Service(b.ns, "web", ann, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(a.ns, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 3))))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(b.ns, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(2, 0, 2))))
	wantA := "10.1.0.1:80=passing,10.1.0.2:80=passing,10.1.0.3:80=passing"
	wantB := "10.2.0.1:80=passing,10.2.0.2:80=passing"
	a.waitInstances("shared", wantA+",192.168.0.2:80=") // the unmarked entry has no readiness check
	b.waitInstances("shared", wantB)

	// Adds and deletes on both sides.
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(a.ns, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 1, 1))))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(b.ns, "web", "w", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(2, 0, 4))))
	a.waitInstances("shared", "10.1.0.2:80=passing,192.168.0.2:80=")
	b.waitInstances("shared", "10.2.0.1:80=passing,10.2.0.2:80=passing,10.2.0.3:80=passing,10.2.0.4:80=passing")
	// b opts out: only b's instances go.
	ann2 := map[string]string{optIn: "false", "consul.hashicorp.com/service-name": "shared"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(b.ns, "web", ann2, ports)))
	b.waitInstances("shared", "")
	a.waitInstances("shared", "10.1.0.2:80=passing,192.168.0.2:80=")

	if got := foreignIndexes(t); got != foreign {
		t.Errorf("foreign entries changed: before %+v, after %+v", foreign, got)
	}
}

type foreignState struct{ hand, unmarked uint64 }

func foreignIndexes(t *testing.T) foreignState {
	t.Helper()
	all, err := fixture.Instances(consul.Client, "shared", "")
	must(t, err)
	var s foreignState
	for _, in := range all {
		switch in.ID {
		case "shared-by-hand":
			s.hand = in.ModifyIndex
		case "shared-unmarked":
			s.unmarked = in.ModifyIndex
		}
	}
	if s.hand == 0 || s.unmarked == 0 {
		t.Fatalf("foreign entries missing: %+v (all: %+v)", s, all)
	}
	return s
}
