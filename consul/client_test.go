package consul

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/consul/api"
)

// TestApplyAgainstConsul drives one instance set through create, update,
// check-only update, stale CAS and delete against a real agent.
func TestApplyAgainstConsul(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "applytest"}
	var txns int
	c := NewClient(a.Client, owner, Options{Observe: func(ops int, _ float64, err error) {
		if err == nil {
			txns++
		}
	}})

	// 300 instances: 2 ops each plus the node op, at most 128 ops per txn,
	// so 63 instances per transaction and 5 transactions.
	var ins []Instance
	for i := range 300 {
		ins = append(ins, owner.instance(i, "apply"))
	}
	before, _ := a.RaftApplies()
	applied, err := c.Apply(ctx, Change{Register: ins})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := a.RaftApplies()
	if applied.Txns != 5 || applied.Registered != 300 || txns != 5 || after-before != 5 {
		t.Fatalf("300 registrations: %d txns (observed %d, raft applies %v), %d registered; want 5, 5, 5, 300",
			applied.Txns, txns, after-before, applied.Registered)
	}
	read, err := c.ReadNode(ctx)
	if err != nil || len(read) != 300 {
		t.Fatalf("ReadNode: %d entries, %v", len(read), err)
	}
	byID := map[string]Registered{}
	for _, r := range read {
		byID[r.ID] = r
	}
	for _, w := range applied.Written {
		r := byID[w.ID]
		if !r.Instance.Equal(w.Instance) || r.ServiceIndex != w.ServiceIndex || r.CheckIndex != w.CheckIndex || !r.HasCheck {
			t.Fatalf("written %+v differs from read %+v", w, r)
		}
	}

	// Update tags of one, status of another: one transaction, CAS on the
	// read indexes; the returned indexes match Consul's.
	r0, r1 := byID[ins[0].ID], byID[ins[1].ID]
	w0 := r0.Instance
	w0.Tags = []string{"k8s", "v2", owner.id}
	w1 := r1.Instance
	w1.Check = Check{Status: StatusWarning, Output: "terminating"}
	applied, err = c.Apply(ctx, Change{Update: []Update{{Want: w0, Have: r0}, {Want: w1, Have: r1}}})
	if err != nil || applied.Txns != 1 || applied.Updated != 2 {
		t.Fatalf("update: %+v, %v", applied, err)
	}
	prefix, err := c.ReadPrefix(ctx, ins[1].ID) // also matches -10, -11, ...
	if err != nil || len(prefix) != 111 {
		t.Fatalf("ReadPrefix(%s): %d entries, %v; want 111", ins[1].ID, len(prefix), err)
	}
	for _, r := range prefix {
		if r.ID == ins[1].ID && (r.Check.Status != StatusWarning || r.ServiceIndex != r1.ServiceIndex) {
			t.Fatalf("check-only update: status %s, service index %d (must stay %d)", r.Check.Status, r.ServiceIndex, r1.ServiceIndex)
		}
	}

	// Stale index: a CAS conflict, and the entry is untouched.
	stale := r0 // holds the index from before the update
	w0.Tags = []string{"k8s", "v3", owner.id}
	_, err = c.Apply(ctx, Change{Update: []Update{{Want: w0, Have: stale}}})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("stale update: err = %v, want ErrConflict", err)
	}
	_, err = c.Apply(ctx, Change{Deregister: []Registered{stale}})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("stale delete: err = %v, want ErrConflict", err)
	}
	// Create of an ID that exists: conflict, never an overwrite.
	_, err = c.Apply(ctx, Change{Register: []Instance{ins[2]}})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("create over an existing entry: err = %v, want ErrConflict", err)
	}

	// Delete everything with the read indexes.
	read, _ = c.ReadNode(ctx)
	applied, err = c.Apply(ctx, Change{Deregister: read})
	if err != nil || applied.Deregistered != 300 {
		t.Fatalf("deregister: %+v, %v", applied, err)
	}
	if read, _ = c.ReadNode(ctx); len(read) != 0 {
		t.Fatalf("%d entries left", len(read))
	}
}

// TestOwnershipIsEnforcedBeforeSending: unstamped writes and deletes of
// entries that are not ours are refused without a request.
func TestOwnershipIsEnforcedBeforeSending(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "refuse"}
	c := NewClient(a.Client, owner, Options{})

	// Someone else's entry, registered by hand on another node.
	_, err := a.Client.Catalog().Register(&api.CatalogRegistration{Node: "other", Address: "127.0.0.2",
		Service: &api.AgentService{ID: "foreign-1", Service: "web", Port: 80, Tags: []string{owner.id}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign := Registered{Instance: Instance{ID: "foreign-1", Name: "web", Tags: []string{owner.id},
		Meta: map[string]string{"k8s-cluster": owner.id}}, Node: "other", ServiceIndex: 1}
	unstamped := owner.instance(1, "web")
	unstamped.Meta = nil

	before, _ := a.RaftApplies()
	for name, ch := range map[string]Change{
		"delete foreign":      {Deregister: []Registered{foreign}},
		"update foreign":      {Update: []Update{{Want: owner.instance(1, "web"), Have: foreign}}},
		"register unstamped":  {Register: []Instance{unstamped}},
		"mixed with good ops": {Register: []Instance{owner.instance(2, "web"), unstamped}},
	} {
		if _, err := c.Apply(ctx, ch); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: err = %v, want ErrRefused", name, err)
		}
	}
	if after, _ := a.RaftApplies(); after != before {
		t.Errorf("refused changes caused %v Raft applies", after-before)
	}
	svcs, _, err := a.Client.Catalog().Service("web", "", nil)
	if err != nil || len(svcs) != 1 || svcs[0].ServiceID != "foreign-1" {
		t.Errorf("catalog after refusals: %+v, %v", svcs, err)
	}
}

func TestReadOfAbsentNodeIsEmpty(t *testing.T) {
	a := needConsul(t)
	c := NewClient(a.Client, testOwner{id: "nobody"}, Options{})
	got, err := c.ReadNode(context.Background())
	if err != nil || len(got) != 0 {
		t.Fatalf("ReadNode of an absent node: %v, %v", got, err)
	}
}
