package consul

import (
	"fmt"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/consultest"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func checkIDs(fs []ForeignCheck) []string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s/%s/%s=%s", f.Node, f.ServiceID, f.CheckID, f.Status))
	}
	return out
}

// TestReadsReportForeignChecks: every read of owned state (the node read,
// the prefix read, the read of a name) reports the checks others put on
// our node or under our instances, never our readiness checks nor the
// checks of someone else's entry; a read that covers a check and no longer
// sees it drops it; a change is signalled once, a read that finds the same
// again signals nothing.
func TestReadsReportForeignChecks(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner := testOwner{id: "checks"}
	c := NewClient(twin.Client(), owner, Options{})
	node := owner.Node().Name
	web := owner.instance(1, "web")
	if _, err := c.Apply(ctx, Change{Register: []Instance{web, owner.instance(2, "api")}}); err != nil {
		t.Fatal(err)
	}
	other := twin.Client()
	// Someone else's entry on our node, with a check of its own: not ours
	// to report (the worker reports the entry).
	if _, err := other.Catalog().Register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &api.AgentService{ID: "stranger", Service: "web"}}, nil); err != nil {
		t.Fatal(err)
	}
	must(t, twin.RegisterCheck(node, "stranger-check", "stranger", api.HealthCritical))

	drain := func() bool {
		select {
		case <-c.ForeignChecksChanged():
			return true
		default:
			return false
		}
	}
	if _, err := c.ReadNode(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.ForeignChecks(); len(got) != 0 || drain() {
		t.Fatalf("before any foreign check: %v (changed: signalled)", checkIDs(got))
	}

	must(t, twin.RegisterCheck(node, "_node_maintenance", "", api.HealthCritical))
	must(t, twin.RegisterCheck(node, "probe", web.ID, api.HealthWarning))
	both := []string{node + "//_node_maintenance=critical", node + "/" + web.ID + "/probe=warning"}
	for name, read := range map[string]func() error{
		"ReadNode":    func() error { _, err := c.ReadNode(ctx); return err },
		"ReadService": func() error { _, _, err := c.ReadService(ctx, "web"); return err },
	} {
		t.Run(name, func(t *testing.T) {
			b := c.checks.begin() // forget what was seen
			c.checks.replace(b, func(string, *ForeignCheck) bool { return true }, nil)
			c.checks.end(b)
			drain()
			if err := read(); err != nil {
				t.Fatal(err)
			}
			if got := checkIDs(c.ForeignChecks()); fmt.Sprint(got) != fmt.Sprint(both) {
				t.Fatalf("foreign checks %v, want %v", got, both)
			}
			if !drain() {
				t.Fatal("no change signalled")
			}
			if err := read(); err != nil || drain() {
				t.Fatalf("the same read again signalled a change (err %v)", err)
			}
		})
	}
	got := c.ForeignChecks()
	if f := got[1]; f.ServiceName != "web" || f.Meta["k8s-cluster"] != owner.id || got[0].NodeLevel() == f.NodeLevel() {
		t.Fatalf("service check %+v: want its instance's name and meta", f)
	}

	// The read of another name on the node sees the node check only: the
	// service check under web stays as it was.
	must(t, twin.DeregisterCheck(node, "probe"))
	if _, _, err := c.ReadService(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	if got := checkIDs(c.ForeignChecks()); fmt.Sprint(got) != fmt.Sprint(both) {
		t.Fatalf("after a read of api: %v, want %v", got, both)
	}
	// The prefix read of web's instances covers its service checks.
	if _, err := c.ReadPrefix(ctx, web.ID); err != nil {
		t.Fatal(err)
	}
	if got := checkIDs(c.ForeignChecks()); fmt.Sprint(got) != fmt.Sprint(both[:1]) {
		t.Fatalf("after the prefix read: %v, want %v", got, both[:1])
	}
	// A status change is a change; the node check gone, nothing is left.
	must(t, twin.RegisterCheck(node, "_node_maintenance", "", api.HealthWarning))
	drain()
	if _, _, err := c.ReadService(ctx, "api"); err != nil || !drain() || c.ForeignChecks()[0].Status != api.HealthWarning {
		t.Fatalf("status change: %v (err %v)", checkIDs(c.ForeignChecks()), err)
	}
	must(t, twin.DeregisterCheck(node, "_node_maintenance"))
	if _, _, err := c.ReadService(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if got := c.ForeignChecks(); len(got) != 0 || !drain() {
		t.Fatalf("after the checks went: %v", checkIDs(got))
	}
	// Nothing of ours was deleted by the reads, and the stranger's check stands.
	if n := len(twin.Services(node)); n != 3 {
		t.Fatalf("%d services on our node, want 3", n)
	}
}

// TestForeignChecksGoWithTheirNode: a whole read that no longer lists a
// node drops what was seen on it.
func TestForeignChecksGoWithTheirNode(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner := testOwner{id: "gone", spread: true}
	c := NewClient(twin.Client(), owner, Options{})
	ins := []Instance{owner.instance(1, "web"), owner.instance(2, "web")} // on .1 and the first node
	if _, err := c.Apply(ctx, Change{Register: ins}); err != nil {
		t.Fatal(err)
	}
	second := owner.Node().Name + ".1"
	must(t, twin.RegisterCheck(second, "_node_maintenance", "", api.HealthCritical))
	if _, err := c.ReadNode(ctx); err != nil || len(c.ForeignChecks()) != 1 {
		t.Fatalf("foreign checks %v (err %v), want the node check of %s", checkIDs(c.ForeignChecks()), err, second)
	}
	if _, err := twin.Client().Catalog().Deregister(&api.CatalogDeregistration{Node: second}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadNode(ctx); err != nil || len(c.ForeignChecks()) != 0 {
		t.Fatalf("after %s went: %v (err %v)", second, checkIDs(c.ForeignChecks()), err)
	}
}

// TestAnOlderReadNeverBringsACheckBack: reads end in any order; what a
// read that began earlier says of a check is dropped once a later one
// said something of it, present or gone, and a gone check is forgotten
// once no older read is left.
func TestAnOlderReadNeverBringsACheckBack(t *testing.T) {
	r := newForeignChecks()
	f := ForeignCheck{Node: "n", CheckID: "_node_maintenance", Status: StatusCritical}
	all := func(string, *ForeignCheck) bool { return true }
	seen := map[string][]ForeignCheck{"n": {f}}
	count := func() int {
		n := 0
		for _, e := range r.byKey {
			if !e.gone {
				n++
			}
		}
		return n
	}
	first := r.begin()
	r.replace(first, all, seen)
	r.end(first)
	slow, fast := r.begin(), r.begin()
	r.replace(fast, all, nil) // the check is gone
	if count() != 0 {
		t.Fatal("the newer read did not drop the check")
	}
	r.end(fast)
	r.replace(slow, all, seen) // an older answer, still showing it
	if count() != 0 {
		t.Fatal("an older read brought the check back")
	}
	r.end(slow)
	if len(r.byKey) != 0 {
		t.Fatalf("%d entries kept once no older read is left", len(r.byKey))
	}
	// Present again, seen by a read begun after: back.
	again := r.begin()
	r.replace(again, all, seen)
	r.end(again)
	if count() != 1 {
		t.Fatal("a check seen again by a new read is not back")
	}
}
