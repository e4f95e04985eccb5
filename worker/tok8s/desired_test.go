package tok8s

import (
	"fmt"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

func testConfig(t *testing.T) Config {
	t.Helper()
	c, err := ownership.New("east")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := k8smark.New("east")
	return Config{Cluster: c, Mark: m, ExcludeTag: "k8s", IncludeClusters: []string{"west"}}
}

func vm(id, addr string, port int, status string) watch.Entry {
	return watch.Entry{ID: id, Service: "web", Address: addr, Port: port, Status: status,
		Node: watch.Node{Name: "vm-" + id, Address: "10.9.9.9"}}
}

func TestKeepIsPerInstance(t *testing.T) {
	c := testConfig(t)
	own := vm("own", "10.0.0.1", 80, "passing")
	own.Node = watch.Node{Name: "k8s-east", Meta: map[string]string{ownership.MetaExternalSource: ownership.ExternalSource, ownership.MetaCluster: "east"}}
	lookalike := own
	lookalike.Node.Meta = nil // named like ours, not marked: someone else's node
	west, north := vm("west", "10.0.0.2", 80, "passing"), vm("north", "10.0.0.3", 80, "passing")
	west.Meta = map[string]string{ownership.MetaExternalSource: ownership.ExternalSource, ownership.MetaCluster: "west"}
	north.Meta = map[string]string{ownership.MetaExternalSource: ownership.ExternalSource, ownership.MetaCluster: "north"}
	tagged, proxy := vm("tagged", "10.0.0.4", 80, "passing"), vm("proxy", "10.0.0.5", 80, "passing")
	tagged.Tags, proxy.Kind = []string{"v1", "k8s"}, "connect-proxy"
	tests := []struct {
		e    watch.Entry
		keep bool
	}{
		{vm("plain", "10.0.0.6", 80, "passing"), true},
		{own, false}, {lookalike, true}, {west, true}, {north, false}, {tagged, false}, {proxy, false},
	}
	for _, tt := range tests {
		if got := c.Keep(tt.e) == ""; got != tt.keep {
			t.Errorf("%s: kept %v, want %v (%s)", tt.e.ID, got, tt.keep, c.Keep(tt.e))
		}
	}
}

func TestHealthTable(t *testing.T) {
	type cond struct{ ready, serving, terminating bool }
	tests := []struct {
		status, warning, critical string
		want                      *cond // nil: dropped
	}{
		{"passing", "", "", &cond{true, true, false}},
		{"warning", "", "", &cond{true, true, false}},
		{"warning", WarningFallback, "", &cond{false, true, true}},
		{"warning", WarningNotReady, "", &cond{false, false, false}},
		{"critical", "", "", &cond{false, false, false}},
		{"critical", "", CriticalDrop, nil},
		{"maintenance", "", "", &cond{false, false, true}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s/%s", tt.status, tt.warning, tt.critical), func(t *testing.T) {
			c := testConfig(t)
			c.Warning, c.Critical = tt.warning, tt.critical
			eps, _ := c.Endpoints([]watch.Entry{vm("a", "10.0.0.1", 80, tt.status)})
			if tt.want == nil {
				if len(eps) != 0 {
					t.Fatalf("kept %+v", eps)
				}
				return
			}
			if len(eps) != 1 {
				t.Fatalf("endpoints %+v", eps)
			}
			k := eps[0].ep.Conditions
			if got := (cond{*k.Ready, *k.Serving, *k.Terminating}); got != *tt.want {
				t.Fatalf("conditions %+v, want %+v", got, *tt.want)
			}
		})
	}
}

func TestAddressesAndFamilies(t *testing.T) {
	c := testConfig(t)
	nodeAddr := vm("n", "", 80, "passing")
	host := vm("h", "db.example.com", 80, "passing")
	eps, problems := c.Endpoints([]watch.Entry{vm("a", "10.0.0.1", 80, "passing"), vm("b", "fd00::1", 80, "passing"), nodeAddr, host, vm("z", "10.0.0.2", 0, "passing")})
	if len(eps) != 3 || len(problems) != 2 {
		t.Fatalf("endpoints %+v, problems %v", eps, problems)
	}
	u := Unit{Namespace: "ns", Name: "web", PortName: PortName}
	got := c.DesiredSlices(u, eps, nil, OwnerOf("web", "uid"))
	if len(got) != 2 || got[0].Name != "web-4-80-0" || got[0].AddressType != discoveryv1.AddressTypeIPv4 || len(got[0].Endpoints) != 2 ||
		got[1].Name != "web-6-80-0" || got[1].Endpoints[0].Addresses[0] != "fd00::1" {
		t.Fatalf("slices %+v", got)
	}
	if got[0].Endpoints[0].Addresses[0] != "10.0.0.1" || got[0].Endpoints[1].Addresses[0] != "10.9.9.9" {
		t.Fatalf("IPv4 endpoints %+v: want the service address, then the node's", got[0].Endpoints)
	}
	for _, s := range got {
		if c.Mark.Owns(s) != nil || s.Labels[discoveryv1.LabelServiceName] != "web" || s.OwnerReferences[0].UID != "uid" {
			t.Fatalf("slice %s: labels %v, owners %v", s.Name, s.Labels, s.OwnerReferences)
		}
	}
}

// TestPlacementIsStable: slices hold at most 100 endpoints, an endpoint
// stays in its slice when others come and go, and an unchanged input
// diffs to nothing.
func TestPlacementIsStable(t *testing.T) {
	c := testConfig(t)
	u := Unit{Namespace: "ns", Name: "web", PortName: PortName}
	owner := OwnerOf("web", "uid")
	entries := func(from, to int) []watch.Entry {
		var out []watch.Entry
		for i := from; i < to; i++ {
			out = append(out, vm(fmt.Sprint(i), fmt.Sprintf("10.1.%d.%d", i/250, i%250), 80, "passing"))
		}
		return out
	}
	eps, _ := c.Endpoints(entries(0, 250))
	first := c.DesiredSlices(u, eps, nil, owner)
	if len(first) != 3 || len(first[0].Endpoints) != 100 || len(first[2].Endpoints) != 50 {
		t.Fatalf("250 endpoints in %d slices", len(first))
	}
	if p := Diff(c.DesiredSlices(u, eps, first, owner), first); !p.Empty() {
		t.Fatalf("unchanged input diffs to %+v", p)
	}
	home := map[string]string{}
	for _, s := range first {
		for _, e := range s.Endpoints {
			home[e.Addresses[0]] = s.Name
		}
	}
	// Drop the first 10, add 30 new ones: only the slices that changed are
	// written, and every kept endpoint stays where it was.
	eps, _ = c.Endpoints(append(entries(10, 250), entries(300, 330)...))
	next := c.DesiredSlices(u, eps, first, owner)
	p := Diff(next, first)
	if len(p.Create) != 0 || len(p.Delete) != 0 || len(p.Update) != 2 {
		t.Fatalf("plan: %d creates, %d updates, %d deletes; want 2 updates", len(p.Create), len(p.Update), len(p.Delete))
	}
	for _, s := range next {
		if len(s.Endpoints) > MaxEndpoints {
			t.Fatalf("slice %s has %d endpoints", s.Name, len(s.Endpoints))
		}
		for _, e := range s.Endpoints {
			if h, ok := home[e.Addresses[0]]; ok && h != s.Name {
				t.Fatalf("%s moved from %s to %s", e.Addresses[0], h, s.Name)
			}
		}
	}
	// Everything gone: every slice deleted.
	if p := Diff(c.DesiredSlices(u, nil, next, owner), next); len(p.Delete) != 3 {
		t.Fatalf("plan with no endpoints: %+v", p)
	}
}
