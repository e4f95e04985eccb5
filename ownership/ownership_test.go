package ownership

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
)

func TestValidateClusterID(t *testing.T) {
	for _, ok := range []string{"a", "prod", "prod-east-1", "0", strings.Repeat("a", 63)} {
		if err := ValidateClusterID(ok); err != nil {
			t.Errorf("%q rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Prod", "prod_east", "-a", "a-", "a.b", strings.Repeat("a", 64), "é"} {
		err := ValidateClusterID(bad)
		if err == nil || !strings.Contains(err.Error(), "DNS label") {
			t.Errorf("%q: err = %v, want a DNS label error", bad, err)
		}
	}
}

func TestInstanceIDIsDeterministicAndUnambiguous(t *testing.T) {
	c, _ := New("east")
	cases := []struct {
		ns, svc, addr string
		port          int
		want          string
	}{
		{"shop", "web", "10.0.0.1", 8080, "k8s_east_shop_web_10.0.0.1_8080"},
		{"shop", "web", "fd00::1", 80, "k8s_east_shop_web_fd00::1_80"},
		{"a-b", "c", "10.0.0.1", 1, "k8s_east_a-b_c_10.0.0.1_1"},
		{"a", "b-c", "10.0.0.1", 1, "k8s_east_a_b-c_10.0.0.1_1"},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		got := c.InstanceID(tc.ns, tc.svc, tc.addr, tc.port)
		if got != tc.want {
			t.Errorf("InstanceID(%s,%s,%s,%d) = %q, want %q", tc.ns, tc.svc, tc.addr, tc.port, got, tc.want)
		}
		if seen[got] {
			t.Errorf("duplicate id %q", got)
		}
		seen[got] = true
		if !strings.HasPrefix(got, c.IDPrefix(tc.ns, tc.svc)) {
			t.Errorf("%q lacks prefix %q", got, c.IDPrefix(tc.ns, tc.svc))
		}
	}
	other, _ := New("west")
	if other.InstanceID("shop", "web", "10.0.0.1", 8080) == c.InstanceID("shop", "web", "10.0.0.1", 8080) {
		t.Error("two clusters derive the same id")
	}
}

func TestStampAndVerify(t *testing.T) {
	east, _ := New("east")
	west, _ := New("west")
	in := consul.Instance{ID: "x", Name: "web", Tags: []string{"k8s", "v1"}, Meta: map[string]string{"team": "a", MetaCluster: "forged"}}
	stamped := east.Stamp(in)
	if !slices.Equal(stamped.Tags, []string{"k8s", "v1", "east"}) || stamped.Meta[MetaCluster] != "east" ||
		stamped.Meta[MetaExternalSource] != ExternalSource || stamped.Meta["team"] != "a" {
		t.Fatalf("stamped = %+v", stamped)
	}
	if in.Meta[MetaCluster] != "forged" || len(in.Tags) != 2 {
		t.Fatal("Stamp modified its input")
	}
	if again := east.Stamp(stamped); !slices.Equal(again.Tags, stamped.Tags) {
		t.Errorf("stamping twice duplicated the tag: %v", again.Tags)
	}
	if err := east.Stamped(stamped); err != nil {
		t.Errorf("Stamped(own) = %v", err)
	}
	if err := west.Stamped(stamped); err == nil {
		t.Error("west accepts east's instance")
	}
	if err := east.Stamped(in); err == nil {
		t.Error("unstamped instance accepted")
	}
	noTag := stamped
	noTag.Tags = []string{"k8s"}
	if err := east.Stamped(noTag); err == nil {
		t.Error("instance without the tag accepted")
	}

	onNode := consul.Registered{Instance: stamped, Node: east.NodeName()}
	if err := east.Owns(onNode); err != nil {
		t.Errorf("Owns(own entry) = %v", err)
	}
	for name, r := range map[string]consul.Registered{
		"other node":         {Instance: stamped, Node: "k8s-sync"},
		"other cluster":      {Instance: west.Stamp(in), Node: east.NodeName()},
		"unmarked, our node": {Instance: in, Node: east.NodeName()},
	} {
		if err := east.Owns(r); err == nil {
			t.Errorf("%s: owned", name)
		}
	}
	n := east.Node()
	if n.Name != "k8s-east" || n.Meta[MetaCluster] != "east" || n.Meta[MetaExternalSource] != ExternalSource {
		t.Errorf("node = %+v", n)
	}
}

// TestNodesSpreadServicesAndStayOwned: with n nodes, every instance of one
// Service goes on the same node, Services spread over all n, every node is
// the cluster's own and carries the mark, and no other cluster's node (even
// one whose id extends this one's) is taken for ours.
func TestNodesSpreadServicesAndStayOwned(t *testing.T) {
	one, _ := New("east")
	if n := one.NodeNameFor(one.InstanceID("shop", "web", "10.0.0.1", 80)); n != "k8s-east" {
		t.Errorf("one node: instance on %s, want k8s-east", n)
	}
	c, err := one.WithNodes(8)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]int{}
	for i := range 400 {
		svc := "svc-" + strconv.Itoa(i)
		node := c.NodeNamed(c.NodeNameFor(c.InstanceID("shop", svc, "10.0.0.1", 80)))
		if other := c.NodeNameFor(c.InstanceID("shop", svc, "fd00::9", 8443)); other != node.Name {
			t.Fatalf("%s: instances on %s and %s", svc, node.Name, other)
		}
		if !c.IsNode(node.Name) || node.Meta[MetaCluster] != "east" || node.Meta[MetaExternalSource] != ExternalSource {
			t.Fatalf("node %+v is not marked as east's", node)
		}
		used[node.Name]++
	}
	if len(used) != 8 {
		t.Errorf("400 Services on %d of 8 nodes: %v", len(used), used)
	}
	for name, n := range used {
		if n < 25 {
			t.Errorf("node %s has %d of 400 Services: badly spread %v", name, n, used)
		}
	}
	for _, notOurs := range []string{"k8s-east-1", "k8s-east.0", "k8s-east.01", "k8s-east.", "k8s-east.x", "k8s-east.1.2", "k8s-eastern", "k8s-east.1024", "east"} {
		if c.IsNode(notOurs) || one.IsNode(notOurs) {
			t.Errorf("%q taken for a node of east", notOurs)
		}
	}
	// Fewer nodes later: what was written on a higher node is still ours.
	if !one.IsNode("k8s-east.7") {
		t.Error("an instance written while spread over 8 nodes is not owned once back to 1")
	}
	in := one.Stamp(consul.Instance{ID: "x", Name: "web"})
	if err := one.Owns(consul.Registered{Instance: in, Node: "k8s-east.7"}); err != nil {
		t.Errorf("owned entry on k8s-east.7 refused: %v", err)
	}
	if err := one.Owns(consul.Registered{Instance: in, Node: "k8s-east-1"}); err == nil || !strings.Contains(err.Error(), "k8s-east-1") {
		t.Errorf("entry on k8s-east-1: err = %v, want one naming the node", err)
	}
	for _, bad := range []int{0, -1, MaxNodes + 1} {
		if _, err := one.WithNodes(bad); err == nil {
			t.Errorf("WithNodes(%d) accepted", bad)
		}
	}
}

// TestIsNode: only k8s-<id> and k8s-<id>.<n>, n written as NodeNameFor
// writes it (1..MaxNodes-1, ASCII decimal, no sign, no leading zero), are
// the cluster's nodes; every other spelling of a number is someone else's.
func TestIsNode(t *testing.T) {
	east, _ := New("east")
	tests := []struct {
		name string
		want bool
	}{
		{"k8s-east", true},
		{"k8s-east.1", true},
		{"k8s-east.9", true},
		{"k8s-east.10", true},
		{"k8s-east.512", true},
		{"k8s-east.1023", true},

		{"k8s-east.", false},
		{"k8s-east.0", false},
		{"k8s-east.00", false},
		{"k8s-east.01", false},
		{"k8s-east.001", false},
		{"k8s-east.+1", false},
		{"k8s-east.+01", false},
		{"k8s-east.-1", false},
		{"k8s-east.-0", false},
		{"k8s-east.1024", false},
		{"k8s-east.9999", false},
		{"k8s-east.10000", false},
		{"k8s-east.99999999999999999999", false},
		{"k8s-east.1e3", false},
		{"k8s-east.0x1", false},
		{"k8s-east.1_0", false},
		{"k8s-east. 1", false},
		{"k8s-east.1 ", false},
		{"k8s-east.1\n", false},
		{"k8s-east.\u0661", false},       // ARABIC-INDIC DIGIT ONE
		{"k8s-east.\uff11", false},       // FULLWIDTH DIGIT ONE
		{"k8s-east.\u0967\u0968", false}, // DEVANAGARI 12
		{"k8s-east.1.2", false},
		{"k8s-east-1", false},
		{"k8s-eastern.1", false},
		{"k8s-west.1", false},
		{"east.1", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.name), func(t *testing.T) {
			if got := east.IsNode(tt.name); got != tt.want {
				t.Errorf("IsNode(%q) = %t, want %t", tt.name, got, tt.want)
			}
		})
	}
	// Every name NodeNameFor can produce is one of ours, at any node count.
	for _, n := range []int{2, 7, MaxNodes} {
		c, err := east.WithNodes(n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2000 {
			if name := c.NodeNameFor(c.InstanceID("ns", "svc-"+strconv.Itoa(i), "10.0.0.1", 80)); !east.IsNode(name) {
				t.Fatalf("%d nodes: NodeNameFor gave %q, which IsNode refuses", n, name)
			}
		}
	}
}

// TestNodesAreConsistent: going from n to n+1 nodes moves only the
// Services that land on the new node, about 1/(n+1) of them, and going
// back moves exactly those again; every Service of the old layout that
// did not move keeps its node.
func TestNodesAreConsistent(t *testing.T) {
	east, _ := New("east")
	const services = 10000
	for _, n := range []int{1, 2, 7, 20, 99, 100, 500} {
		from, _ := east.WithNodes(n)
		to, _ := east.WithNodes(n + 1)
		newNode := to.NodeName() + "." + strconv.Itoa(n)
		moved := 0
		for i := range services {
			id := east.InstanceID("ns-"+strconv.Itoa(i%13), "svc-"+strconv.Itoa(i), "10.0.0.1", 80)
			a, b := from.NodeNameFor(id), to.NodeNameFor(id)
			if a == b {
				continue
			}
			if b != newNode {
				t.Fatalf("%d -> %d nodes: a Service moved from %s to %s, not to the new node %s", n, n+1, a, b, newNode)
			}
			moved++
		}
		want := float64(services) / float64(n+1)
		if f := float64(moved); f < want*0.8 || f > want*1.2 {
			t.Errorf("%d -> %d nodes: %d of %d Services moved, want about %.0f", n, n+1, moved, services, want)
		}
	}
}

// TestNodeNameForAllocatesNothing: the diff asks for every instance, so
// neither the hash nor the name costs an allocation, whatever the node.
func TestNodeNameForAllocatesNothing(t *testing.T) {
	east, _ := New("east")
	c, _ := east.WithNodes(64)
	for i := range 20 {
		id := c.InstanceID("shop", "web-"+strconv.Itoa(i), "10.0.0.1", 80)
		if n := testing.AllocsPerRun(100, func() { _ = c.NodeNameFor(id) }); n != 0 {
			t.Errorf("NodeNameFor(%s) (on %s) allocates %.0f times per call", id, c.NodeNameFor(id), n)
		}
	}
}

func TestNodeNumber(t *testing.T) {
	east, _ := New("east")
	for name, want := range map[string]int{"k8s-east": 0, "k8s-east.1": 1, "k8s-east.1023": 1023} {
		if n, ok := east.NodeNumber(name); !ok || n != want {
			t.Errorf("NodeNumber(%q) = %d, %t; want %d, true", name, n, ok, want)
		}
	}
	for _, name := range []string{"k8s-east.0", "k8s-east.01", "k8s-eastern", "k8s-west.1", "k8s-east.1024"} {
		if _, ok := east.NodeNumber(name); ok {
			t.Errorf("NodeNumber(%q) accepted", name)
		}
	}
}
