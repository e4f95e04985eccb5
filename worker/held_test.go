package worker

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/ownership"
)

// TestHeldIsWhatEqualSays: for every pair of a set of instances that
// differ in one field each (and some that differ only in how they are
// built), Hold(x).Is(y) answers what x.Equal(y) answers.
func TestHeldIsWhatEqualSays(t *testing.T) {
	base := testCluster(t).Stamp(consul.Instance{ID: "shop-web-1", Name: "web", Address: "10.0.0.1", Port: 8080,
		Tags: []string{"k8s", "blue"}, Meta: map[string]string{MetaNamespace: "shop", MetaService: "web", MetaPod: "web-1"},
		Check: consul.Check{Status: consul.StatusPassing, Output: OutputReady}})
	edit := func(name string, f func(*consul.Instance)) struct {
		name string
		in   consul.Instance
	} {
		in := cloneInstance(base)
		f(&in)
		return struct {
			name string
			in   consul.Instance
		}{name, in}
	}
	set := []struct {
		name string
		in   consul.Instance
	}{
		edit("base", func(*consul.Instance) {}),
		edit("same, meta built in another order", func(i *consul.Instance) {
			m := map[string]string{}
			for _, k := range []string{MetaPod, "k8s-cluster", MetaService, "external-source", MetaNamespace} {
				if v, ok := i.Meta[k]; ok {
					m[k] = v
				}
			}
			for k, v := range i.Meta {
				m[k] = v
			}
			i.Meta = m
		}),
		edit("id", func(i *consul.Instance) { i.ID = "shop-web-2" }),
		edit("name", func(i *consul.Instance) { i.Name = "web2" }),
		edit("address", func(i *consul.Instance) { i.Address = "10.0.0.2" }),
		edit("port", func(i *consul.Instance) { i.Port = 8081 }),
		edit("weight", func(i *consul.Instance) { i.Weight = 3 }),
		edit("tag order", func(i *consul.Instance) { i.Tags[0], i.Tags[1] = i.Tags[1], i.Tags[0] }),
		edit("a tag more", func(i *consul.Instance) { i.Tags = append(i.Tags, "green") }),
		edit("tags joined", func(i *consul.Instance) { i.Tags = append([]string{i.Tags[0] + i.Tags[1]}, i.Tags[2:]...) }),
		edit("no tags", func(i *consul.Instance) { i.Tags = nil }),
		edit("empty tags", func(i *consul.Instance) { i.Tags = []string{} }),
		edit("meta value", func(i *consul.Instance) { i.Meta[MetaPod] = "web-2" }),
		edit("meta key", func(i *consul.Instance) { i.Meta["pod"] = i.Meta[MetaPod]; delete(i.Meta, MetaPod) }),
		edit("meta boundary", func(i *consul.Instance) { delete(i.Meta, MetaPod); i.Meta[MetaPod+"w"] = "eb-1" }),
		edit("meta key and value swapped", func(i *consul.Instance) { delete(i.Meta, MetaPod); i.Meta["web-1"] = MetaPod }),
		edit("a meta pair more", func(i *consul.Instance) { i.Meta["team"] = "" }),
		edit("meta pairs swapped", func(i *consul.Instance) {
			i.Meta[MetaNamespace], i.Meta[MetaService] = i.Meta[MetaService], i.Meta[MetaNamespace]
		}),
		edit("no meta", func(i *consul.Instance) { i.Meta = nil }),
		edit("empty meta", func(i *consul.Instance) { i.Meta = map[string]string{} }),
		edit("address and port moved", func(i *consul.Instance) { i.Address, i.Port = "10.0.0.18", 80 }),
		edit("check status", func(i *consul.Instance) { i.Check.Status = consul.StatusCritical }),
		edit("check output", func(i *consul.Instance) { i.Check.Output = "other" }),
	}
	for _, x := range set {
		h := Hold(consul.Registered{Instance: x.in, Node: "k8s-east", ServiceIndex: 7, CheckIndex: 8, HasCheck: true})
		for _, y := range set {
			if got, want := h.Is(y.in), x.in.Equal(y.in); got != want {
				t.Errorf("Hold(%s).Is(%s) = %v, Equal says %v", x.name, y.name, got, want)
			}
		}
	}
}

// TestHeldEntryGoesToTheWriterAsOurs: an entry a worker holds is handed to
// the consul writer with its ID, name, node, namespace, check and indexes,
// and with the cluster's mark; the writer's check (Owns) passes on our
// node and refuses it for another cluster, by the node (the mark an entry
// carries in Consul was checked when it was read: TestOwnedOf).
func TestHeldEntryGoesToTheWriterAsOurs(t *testing.T) {
	cluster := testCluster(t)
	in := cluster.Stamp(consul.Instance{ID: "shop-web-1", Name: "web", Address: "10.0.0.1", Port: 8080,
		Meta: map[string]string{MetaNamespace: "shop", MetaService: "web"}, Check: consul.Check{Status: consul.StatusWarning, Output: "x"}})
	read := consul.Registered{Instance: in, Node: cluster.NodeName(), Namespace: "team", ServiceIndex: 7, CheckIndex: 8, HasCheck: true}
	got := Hold(read).Registered(MarkOf(cluster))
	if err := cluster.Owns(got); err != nil {
		t.Fatalf("the writer would refuse it: %v", err)
	}
	if got.ID != read.ID || got.Name != read.Name || got.Node != read.Node || got.Namespace != read.Namespace || got.Check != read.Check ||
		got.ServiceIndex != 7 || got.CheckIndex != 8 || !got.HasCheck {
		t.Errorf("handed %+v, read %+v", got, read)
	}
	other, err := ownership.New("west")
	if err != nil {
		t.Fatal(err)
	}
	if other.Owns(Hold(read).Registered(MarkOf(other))) == nil {
		t.Error("another cluster's writer would take an entry on our node")
	}
}

// TestWorkerStartedWithTheReadWritesNothing: a worker started with the
// fleet's read of entries equal to its desired instances (decoded copies,
// as after a restart) holds them and writes nothing on its first look.
func TestWorkerStartedWithTheReadWritesNothing(t *testing.T) {
	svc := benchSvc(3)
	spec, err := Desired(svc, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	var read []consul.Registered
	for i, in := range spec.Instances {
		read = append(read, consul.Registered{Instance: cloneInstance(in), Node: testCluster(t).NodeName(),
			ServiceIndex: uint64(i + 1), CheckIndex: uint64(i + 1), HasCheck: true})
	}
	held, skipped := HoldOwned(testCluster(t), read)
	if skipped != 0 {
		t.Fatalf("HoldOwned skipped %d of our entries", skipped)
	}
	h := newHarness(t, svc, func(h *harness, o *Options) { o.Owned = held[testKey] })
	h.start()
	if f := h.flush(); f.Wrote || f.Err != nil {
		t.Fatalf("first look: %+v, want nothing written", f)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	if len(h.w.owned) != len(read) {
		t.Fatalf("%d owned entries, want %d", len(h.w.owned), len(read))
	}
	for _, in := range spec.Instances {
		if r := h.w.owned[in.ID]; r.ServiceIndex == 0 || !r.HasCheck || !r.Is(in) {
			t.Errorf("%s lost what was read: %+v", in.ID, r)
		}
	}
	if applies, _ := h.store.counts(); applies != 0 {
		t.Errorf("%d applies, want 0", applies)
	}
}

// TestHeldSharesRepeatedStrings: entries read from Consul (each with its
// own decoded copy of name, node and check) hold one copy of each.
func TestHeldSharesRepeatedStrings(t *testing.T) {
	read := func() consul.Registered {
		return consul.Registered{Instance: consul.Instance{ID: "x", Name: strings.Clone("web"),
			Check: consul.Check{Status: strings.Clone(consul.StatusPassing), Output: strings.Clone(OutputReady)}},
			Node: strings.Clone("k8s-east.7")}
	}
	a, b := Hold(read()), Hold(read())
	for _, pair := range [][2]string{{a.Name, b.Name}, {a.Node, b.Node}, {a.Check.Status, b.Check.Status}, {a.Check.Output, b.Check.Output}} {
		if pair[0] != pair[1] || unsafe.StringData(pair[0]) != unsafe.StringData(pair[1]) {
			t.Errorf("%q and %q are two copies", pair[0], pair[1])
		}
	}
}
