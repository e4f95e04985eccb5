package consul

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// TestLeanReadsAgreeWithTheAPIClient: on a real agent, what the lean reads
// and the lean transaction answer give is what consul/api's full types give
// for every field fleetsync compares.
func TestLeanReadsAgreeWithTheAPIClient(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "lean"}
	c := NewClient(a.Client, owner, Options{})
	in := []Instance{owner.instance(1, "web"), owner.instance(2, "web"), owner.instance(3, "web")}
	in[1].Weight, in[1].Tags = 5, append(in[1].Tags, "blue")
	in[2].Check = Check{Status: api.HealthCritical, Output: "not ready"}
	applied, err := c.Apply(ctx, Change{Register: in})
	if err != nil {
		t.Fatal(err)
	}
	node := owner.Node().Name
	list, _, err := a.Client.Catalog().NodeServiceList(node, nil)
	if err != nil {
		t.Fatal(err)
	}
	checks, _, err := a.Client.Health().Node(node, nil)
	if err != nil {
		t.Fatal(err)
	}
	byCheck := map[string]*api.HealthCheck{}
	for _, hc := range checks {
		byCheck[hc.CheckID] = hc
	}
	want := map[string]Registered{}
	for _, s := range list.Services {
		hc := byCheck[CheckID(s.ID)]
		want[s.ID] = Registered{
			Instance: Instance{ID: s.ID, Name: s.Service, Address: s.Address, Port: s.Port, Weight: weightOf(s.Weights),
				Tags: s.Tags, Meta: s.Meta, Check: Check{Status: hc.Status, Output: hc.Output}},
			Node: node, Namespace: s.Namespace, ServiceIndex: s.ModifyIndex, CheckIndex: hc.ModifyIndex, HasCheck: true,
		}
	}
	if len(want) != len(in) {
		t.Fatalf("the API client read %d instances, want %d", len(want), len(in))
	}
	same := func(how string, got []Registered) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d instances, want %d", how, len(got), len(want))
		}
		for _, g := range got {
			w := want[g.ID]
			if !g.Instance.Equal(w.Instance) || g.Check != w.Check || g.Node != w.Node || g.Namespace != w.Namespace ||
				g.ServiceIndex != w.ServiceIndex || g.CheckIndex != w.CheckIndex || g.HasCheck != w.HasCheck ||
				!slices.Equal(g.Tags, w.Tags) || !maps.Equal(g.Meta, w.Meta) {
				t.Errorf("%s: %+v\nthe API client: %+v", how, g, w)
			}
		}
	}
	// The daemon's client (a Conn's) reads without consul/api (wire.Raw).
	cn, err := conn.Open(conn.Config{Addresses: []string{a.HTTPAddr}})
	if err != nil {
		t.Fatal(err)
	}
	raw := NewConnClient(cn, owner, Options{})
	if raw.api.(wire.API).Raw == nil {
		t.Fatal("a Conn's client reads through consul/api")
	}
	for how, rc := range map[string]*Client{"consul/api": c, "raw": raw} {
		got, err := rc.ReadNode(ctx)
		if err != nil {
			t.Fatal(err)
		}
		same(how+": the node read", got)
		got, _, err = rc.ReadService(ctx, "web")
		if err != nil {
			t.Fatal(err)
		}
		same(how+": the service read", got)
	}
	// The transaction's answer gave the indexes the reads now show.
	for _, w := range applied.Written {
		if r := want[w.ID]; w.ServiceIndex != r.ServiceIndex || w.CheckIndex != r.CheckIndex {
			t.Errorf("%s: the answer gave indexes %d/%d, the read %d/%d", w.ID, w.ServiceIndex, w.CheckIndex, r.ServiceIndex, r.CheckIndex)
		}
	}
	// A rolled back transaction's answer names the failed op.
	_, err = c.Apply(ctx, Change{Register: []Instance{in[0]}})
	var te *TxnError
	if err == nil || !errors.As(err, &te) || len(te.Errors) == 0 || !te.Conflict {
		t.Fatalf("a create of an existing instance: %v, want a CAS conflict naming the op", err)
	}
}
