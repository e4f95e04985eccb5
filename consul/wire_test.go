package consul

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"
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
	// The daemon's client (a Conn's) reads without consul/api (rawReads).
	cn, err := Open(ConnConfig{Addresses: []string{a.HTTPAddr}})
	if err != nil {
		t.Fatal(err)
	}
	raw := cn.NewClient(owner, Options{})
	if raw.api.(apiAdapter).raw == nil {
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

// BenchmarkDecode decodes Consul's own answers (a real agent's, 1,000
// instances on one node: what a restart reads per node, and one Service's
// transaction of 10) into consul/api's types, into the lean ones with
// encoding/json, and into the lean ones as the daemon does (decode).
func BenchmarkDecode(b *testing.B) {
	if agent == nil {
		b.Skip("needs a real Consul agent; skipped under -short")
	}
	ctx := b.Context()
	owner := testOwner{id: "decode"}
	c := NewClient(agent.Client, owner, Options{})
	var all []Instance
	for i := range 1000 {
		all = append(all, owner.instance(i, fmt.Sprintf("svc-%d", i/10)))
	}
	for i := 0; i < len(all); i += 100 {
		if _, err := c.Apply(ctx, Change{Register: all[i : i+100]}); err != nil {
			b.Fatal(err)
		}
	}
	node := owner.Node().Name
	get := func(path string) []byte {
		resp, err := http.Get(agent.HTTPAddr + path)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		return body
	}
	services, checks := get("/v1/catalog/node-services/"+node), get("/v1/health/node/"+node)
	// The answer of one Service's transaction: its node op and 10 service
	// and check ops, rewritten as they are.
	var ops api.TxnOps
	ops = append(ops, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet, Node: api.Node{Node: node, Address: owner.Node().Address, Meta: owner.Node().Meta}}})
	for _, in := range all[:10] {
		ops = append(ops, c.serviceOp(node, in, 0), c.checkOp(node, in, 0))
		ops[len(ops)-2].Service.Verb, ops[len(ops)-1].Check.Verb = api.ServiceSet, api.CheckSet
	}
	body, err := json.Marshal(ops)
	if err != nil {
		b.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, agent.HTTPAddr+"/v1/txn", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	txn, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("txn: %d %v %s", resp.StatusCode, err, txn)
	}
	cases := []struct {
		name string
		body []byte
		full func() any
		lean func() any
	}{
		{"node-services-1000", services, func() any { return &api.CatalogNodeServiceList{} }, func() any { return &wireNodeServices{} }},
		{"health-node-1000", checks, func() any { return &api.HealthChecks{} }, func() any { return new([]*wireCheck) }},
		{"txn-answer-10", txn, func() any { return &api.TxnResponse{} }, func() any { return &wireTxnResponse{} }},
	}
	for _, tc := range cases {
		if !scanDecode(tc.body, tc.lean()) {
			b.Fatalf("%s: scanDecode gave up on Consul's answer", tc.name)
		}
		for _, kind := range []string{"api", "lean", "scan"} {
			b.Run(tc.name+"/"+kind, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(tc.body)))
				for b.Loop() {
					var err error
					switch kind {
					case "api":
						err = json.Unmarshal(tc.body, tc.full())
					case "lean":
						err = json.Unmarshal(tc.body, tc.lean())
					case "scan":
						err = decode(tc.body, tc.lean())
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
