package consul

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// TestRawReadsAnswerAsTheAPIClient: on the twin, the raw reads decode to
// what consul/api decodes, with the same index, and a refused read is the
// same api.StatusError.
func TestRawReadsAnswerAsTheAPIClient(t *testing.T) {
	twin := consultest.New(t)
	owner := testOwner{id: "raw"}
	setup := NewClient(twin.Client(), owner, Options{})
	in := []Instance{owner.instance(1, "web"), owner.instance(2, "web"), owner.instance(3, "api")}
	in[1].Tags = append(in[1].Tags, `quote"and\\backslash`, "ünïcode")
	in[2].Check = Check{Status: api.HealthCritical, Output: "line one\nline two"}
	if _, err := setup.Apply(t.Context(), Change{Register: in}); err != nil {
		t.Fatal(err)
	}
	cfg := api.DefaultConfig()
	cfg.Address = twin.Addr()
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	viaAPI, viaRaw := wire.API{C: c}, wire.API{C: c, Raw: wire.NewRaw(cfg)}
	node := owner.Node().Name
	q := &api.QueryOptions{NodeMeta: owner.Node().Meta}
	s1, m1, err1 := viaAPI.NodeServices(node, q)
	s2, m2, err2 := viaRaw.NodeServices(node, q)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(s1, s2) || m1.LastIndex != m2.LastIndex || len(s2.Services) != 3 {
		t.Errorf("node services: consul/api %+v (%v), raw %+v (%v)", s1, err1, s2, err2)
	}
	c1, _, err1 := viaAPI.NodeChecks(node, q)
	c2, _, err2 := viaRaw.NodeChecks(node, q)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(c1, c2) || len(c2) != 3 {
		t.Errorf("node checks: consul/api %+v (%v), raw %+v (%v)", c1, err1, c2, err2)
	}
	e1, m1, err1 := viaAPI.ServiceEntries("web", q)
	e2, m2, err2 := viaRaw.ServiceEntries("web", q)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(e1, e2) || m1.LastIndex != m2.LastIndex || len(e2) != 2 {
		t.Errorf("service entries: consul/api %+v (%v), raw %+v (%v)", e1, err1, e2, err2)
	}
	twin.SetFault(func(*http.Request) error { return errors.New("the leader is gone") })
	_, _, err1 = viaAPI.NodeServices(node, q)
	_, _, err2 = viaRaw.NodeServices(node, q)
	var se1, se2 api.StatusError
	if !errors.As(err1, &se1) || !errors.As(err2, &se2) || se1 != se2 {
		t.Errorf("a refused read: consul/api %v, raw %v", err1, err2)
	}
}

// TestRawTxnSendsWhatTheAPIClientSends: a transaction sent from its
// groups' own encoding (txnBody, wire.Raw) is byte for byte the
// request consul/api sends for the same ops and options (method, path,
// query, headers, body), and both decode a commit's and a rollback's
// answer alike.
func TestRawTxnSendsWhatTheAPIClientSends(t *testing.T) {
	type seen struct {
		method, path string
		query        url.Values
		header       http.Header
		body         string
	}
	var mu sync.Mutex
	var got []seen
	answer, status := "", http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		header := r.Header.Clone()
		header.Del("User-Agent")
		header.Del("Accept-Encoding")
		header.Del("Content-Length")
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.EscapedPath(), r.URL.Query(), header, string(body)})
		a, code := answer, status
		mu.Unlock()
		w.WriteHeader(code)
		_, _ = w.Write([]byte(a))
	}))
	defer srv.Close()
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Datacenter, cfg.Token = strings.TrimPrefix(srv.URL, "http://"), "dc9", "static-token"
	cfg.HttpAuth = &api.HttpBasicAuth{Username: "proxy-user", Password: "proxy-secret"}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	viaAPI, viaRaw := wire.API{C: c}, wire.API{C: c, Raw: wire.NewRaw(cfg)}

	owner := testOwner{id: "raw"}
	client := NewClient(c, owner, Options{})
	in := owner.instance(1, "web")
	in.Meta["odd"] = `<quote"&backslash\ ünïcode>`
	in.Tags = append(in.Tags, "a&b")
	first := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: "fleetsync/claims/raw", Session: "s-1"}},
		{Node: &api.NodeTxnOp{Verb: api.NodeCAS, Node: api.Node{Node: "k8s-raw", Address: "127.0.0.1", Meta: map[string]string{"k": "v"}, ModifyIndex: 3}}},
	}
	reg, err1 := newGroup("k8s-raw", kindRegister, client.serviceOp("k8s-raw", in, 0), client.checkOp("k8s-raw", in, 0))
	del, err2 := newGroup("k8s-raw", kindDeregister, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceDeleteCAS, Node: "k8s-raw",
		Service: api.AgentService{ID: "gone", Service: "web", ModifyIndex: 9}}})
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	groups := []group{reg, del}
	body, err := txnBody(first, groups)
	if err != nil {
		t.Fatal(err)
	}
	ops := append(slices.Clone(first), groups[0].ops...)
	ops = append(ops, groups[1].ops...)
	for _, q := range []*api.QueryOptions{{}, {Namespace: "team", Partition: "p1", Datacenter: "dc2", Token: "per-request"}} {
		for _, tc := range []struct {
			answer string
			status int
			ok     bool
		}{
			{`{"Results":[{"Service":{"ID":"k8s_raw_1","ModifyIndex":12,"Tags":["x"]}},{"Check":{"CheckID":"c","ModifyIndex":13}},{"Node":{"Node":"k8s-raw","CreateIndex":1,"ModifyIndex":14}}],"Errors":null}`, http.StatusOK, true},
			{`{"Results":null,"Errors":[{"OpIndex":2,"What":"failed to set service: CAS failed"}]}`, http.StatusConflict, false},
		} {
			mu.Lock()
			got, answer, status = nil, tc.answer, tc.status
			mu.Unlock()
			ok1, r1, err1 := viaAPI.CommitTxn(ops, nil, q)
			ok2, r2, err2 := viaRaw.CommitTxn(ops, body, q)
			if err1 != nil || err2 != nil || ok1 != tc.ok || ok2 != tc.ok || !reflect.DeepEqual(r1, r2) {
				t.Errorf("answer %d: consul/api %v %+v (%v), raw %v %+v (%v)", tc.status, ok1, r1, err1, ok2, r2, err2)
			}
			mu.Lock()
			if len(got) != 2 || !reflect.DeepEqual(got[0], got[1]) {
				t.Errorf("options %+v: requests differ:\nconsul/api %+v\nraw        %+v", q, got[0], got[1])
			}
			mu.Unlock()
		}
	}
	mu.Lock()
	answer, status = "no leader", http.StatusInternalServerError
	mu.Unlock()
	_, _, err1 = viaAPI.CommitTxn(ops, nil, &api.QueryOptions{})
	_, _, err2 = viaRaw.CommitTxn(ops, body, &api.QueryOptions{})
	var se1, se2 api.StatusError
	if !errors.As(err1, &se1) || !errors.As(err2, &se2) || se1 != se2 {
		t.Errorf("a refused transaction: consul/api %v, raw %v", err1, err2)
	}
}

// TestAnOpThatCannotBeEncodedIsAnError: a group's body must hold every op
// it counts, so an op encoding/json refuses fails the group instead of
// leaving the op out of the request.
func TestAnOpThatCannotBeEncodedIsAnError(t *testing.T) {
	bad := &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceCAS, Node: "k8s-raw", Service: api.AgentService{ID: "x",
		Proxy: &api.AgentServiceConnectProxyConfig{Config: map[string]any{"c": make(chan int)}}}}}
	if g, err := newGroup("k8s-raw", kindRegister, bad); err == nil {
		t.Fatalf("newGroup = %+v (body %q), want an error", g, g.enc)
	}
}
