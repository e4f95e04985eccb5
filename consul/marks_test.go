package consul

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/consultest"
)

// TestCatalogMarksMoveWithEveryCatalogWrite pins, on a real agent, what a
// pass over a quiet catalog stands on: every kind of catalog write, on any
// node, by anyone, moves one of the two marks; a KV write (the cluster-id
// claim's) moves neither.
func TestCatalogMarksMoveWithEveryCatalogWrite(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "marks"}
	c := NewClient(a.Client, owner, Options{})
	ins := []Instance{owner.instance(2, "web"), owner.instance(4, "web")}
	if _, err := c.Apply(ctx, Change{Register: ins}); err != nil {
		t.Fatal(err)
	}
	marks := func() CatalogMarks {
		t.Helper()
		m, err := c.readMarks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !m.Known() {
			t.Fatalf("marks %+v: an index is unknown", m)
		}
		return m
	}
	node := owner.Node().Name
	cat := a.Client.Catalog()
	register := func(r *api.CatalogRegistration) func() error {
		return func() error { _, err := cat.Register(r, nil); return err }
	}
	deregister := func(d *api.CatalogDeregistration) func() error {
		return func() error { _, err := cat.Deregister(d, nil); return err }
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"a service edited", register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
			Service: &api.AgentService{ID: ins[0].ID, Service: "web", Address: "10.9.9.9", Port: 80, Tags: ins[0].Tags, Meta: ins[0].Meta}})},
		{"a service renamed", register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
			Service: &api.AgentService{ID: ins[0].ID, Service: "other", Address: "10.9.9.9", Port: 80, Tags: ins[0].Tags, Meta: ins[0].Meta}})},
		{"a check's status changed", register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
			Check: &api.AgentCheck{Node: node, CheckID: CheckID(ins[1].ID), Name: "x", Status: api.HealthCritical, ServiceID: ins[1].ID}})},
		{"a check's output changed", register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
			Check: &api.AgentCheck{Node: node, CheckID: CheckID(ins[1].ID), Name: "x", Status: api.HealthCritical, Output: "tampered", ServiceID: ins[1].ID}})},
		{"a check deleted", deregister(&api.CatalogDeregistration{Node: node, CheckID: CheckID(ins[1].ID)})},
		{"a service deleted", deregister(&api.CatalogDeregistration{Node: node, ServiceID: ins[1].ID})},
		{"a node's meta changed", register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", NodeMeta: map[string]string{"edited": "yes"}})},
		{"a service added on someone else's node", register(&api.CatalogRegistration{Node: "elsewhere", Address: "10.1.1.1",
			Service: &api.AgentService{ID: "theirs", Service: "web", Port: 8080}})},
		{"a node deleted", deregister(&api.CatalogDeregistration{Node: "elsewhere"})},
	}
	for _, s := range steps {
		before := marks()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if after := marks(); after == before {
			t.Errorf("%s: the marks stayed at %+v", s.what, after)
		}
	}
	before := marks()
	if _, err := a.Client.KV().Put(&api.KVPair{Key: "marks-test/claim", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	if after := marks(); after != before {
		t.Errorf("a KV write moved the marks: %+v -> %+v", before, after)
	}
}

// TestCatalogMarksAreSharedForMaxAge: callers within MarksMaxAge of a read
// share it (no request); a later caller reads again.
func TestCatalogMarksAreSharedForMaxAge(t *testing.T) {
	srv := consultest.New(t)
	var nodeReads, checkReads atomic.Int32
	srv.SetFault(func(r *http.Request) error {
		switch {
		case r.URL.Path == "/v1/catalog/nodes" && r.URL.Query().Get("node-meta") == marksProbe+":none":
			nodeReads.Add(1)
		case strings.HasPrefix(r.URL.Path, "/v1/health/node/"+marksProbe):
			checkReads.Add(1)
		}
		return nil
	})
	owner := testOwner{id: "share"}
	c := NewClient(srv.Client(), owner, Options{})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	read := func() CatalogMarks {
		t.Helper()
		m, err := c.CatalogMarks(t.Context(), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	first := read()
	if !first.Known() {
		t.Fatalf("marks %+v from the fake", first)
	}
	now = now.Add(MarksMaxAge)
	read()
	if n, m := nodeReads.Load(), checkReads.Load(); n != 1 || m != 1 {
		t.Fatalf("two calls within MarksMaxAge made %d nodes and %d checks reads, want 1 and 1", n, m)
	}
	if _, err := c.Apply(t.Context(), Change{Register: []Instance{owner.instance(1, "web")}}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Nanosecond)
	if got := read(); got == first {
		t.Errorf("marks %+v after a write and MarksMaxAge, want them moved", got)
	}
	if n := nodeReads.Load(); n != 2 {
		t.Errorf("%d nodes reads after MarksMaxAge passed, want 2", n)
	}
	// Marks asked for from after a time read again if the shared read
	// began before it.
	now = now.Add(time.Millisecond)
	if _, err := c.CatalogMarks(t.Context(), now); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CatalogMarks(t.Context(), now); err != nil {
		t.Fatal(err)
	}
	if n := nodeReads.Load(); n != 3 {
		t.Errorf("%d nodes reads after two asks for marks from now on, want 3 (one new read, then shared)", n)
	}
}

// TestCatalogMarksAreUnknownInEnterpriseScopes: no request, and zero marks
// (so no pass skips on them).
func TestCatalogMarksAreUnknownInEnterpriseScopes(t *testing.T) {
	srv := consultest.New(t)
	var reads atomic.Int32
	srv.SetFault(func(*http.Request) error { reads.Add(1); return nil })
	c := NewClient(srv.Client(), testOwner{id: "ent"}, Options{Scope: Scope{Namespace: "team-a"}})
	m, err := c.CatalogMarks(t.Context(), time.Time{})
	if err != nil || m.Known() || reads.Load() != 0 {
		t.Fatalf("marks %+v, err %v, %d requests: want unknown marks and no request", m, err, reads.Load())
	}
}
