package consul

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// TestLookAlikeNodeIsNeverWritten: a node named like ours without our mark
// (someone else's, with its own address, meta and service) is refused
// before anything is sent: its record and its service stay as they were.
func TestLookAlikeNodeIsNeverWritten(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "lookalike"}
	if _, err := a.Client.Catalog().Register(&api.CatalogRegistration{Node: owner.Node().Name, Address: "10.9.9.9",
		NodeMeta: map[string]string{"team": "payments"},
		Service:  &api.AgentService{ID: "theirs", Service: "billing", Port: 9000}}, nil); err != nil {
		t.Fatal(err)
	}
	before, _, err := a.Client.Catalog().Node(owner.Node().Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(a.Client, owner, Options{})
	view, err := c.ReadNodes(ctx)
	if err != nil || len(view.Foreign()) != 1 || view.Foreign()[0].Address != "10.9.9.9" {
		t.Fatalf("ReadNodes = %+v, %v; want the look-alike node as foreign", view, err)
	}
	_, err = c.Apply(ctx, Change{Register: []Instance{owner.instance(1, "web")}})
	var fe *ForeignNodeError
	if !errors.As(err, &fe) || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "10.9.9.9") {
		t.Fatalf("Apply onto a look-alike node: err = %v, want a ForeignNodeError naming its address", err)
	}
	after, _, err := a.Client.Catalog().Node(owner.Node().Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if after.Node.ModifyIndex != before.Node.ModifyIndex || after.Node.Address != "10.9.9.9" || after.Node.Meta["team"] != "payments" ||
		len(after.Services) != 1 || after.Services["theirs"].ModifyIndex != before.Services["theirs"].ModifyIndex {
		t.Fatalf("look-alike node changed: before %+v, after %+v", before.Node, after.Node)
	}
}

// TestNodeOpIsConditional: the node op is a CAS on the node as last seen.
// A node created by someone else between our read and our write (or our
// own node taken over) fails the transaction instead of being replaced;
// once the registry is read again, the look-alike is refused.
func TestNodeOpIsConditional(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner := testOwner{id: "nodecas"}
	c := NewClient(twin.Client(), owner, Options{})
	if _, err := c.ReadNodes(ctx); err != nil { // our node: absent
		t.Fatal(err)
	}
	if _, err := twin.Client().Catalog().Register(&api.CatalogRegistration{Node: owner.Node().Name, Address: "10.9.9.8",
		NodeMeta: map[string]string{"team": "search"}}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(1, "web")}})
	var te *TxnError
	if !errors.Is(err, ErrConflict) || !errors.As(err, &te) || len(te.Nodes) != 1 || te.Nodes[0] != owner.Node().Name {
		t.Fatalf("Apply after someone created our node's name: err = %v, want a conflict on node %s", err, owner.Node().Name)
	}
	if _, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(1, "web")}}); !errors.Is(err, ErrForeignNode) {
		t.Fatalf("second Apply: err = %v, want ErrForeignNode", err)
	}
	n, _, err := twin.Client().Catalog().Node(owner.Node().Name, nil)
	if err != nil || n.Node.Address != "10.9.9.8" || len(n.Services) != 0 {
		t.Fatalf("the other node was written: %+v, %v", n, err)
	}
}

// TestCheckOnlyUpdateIsGuardedByTheServiceIndex: a readiness change is
// written with a CAS on the service too: it leaves the service entry as it
// is (same ModifyIndex), and it fails when someone re-registered the entry
// under our ID since it was read, so their entry's health is never set.
func TestCheckOnlyUpdateIsGuardedByTheServiceIndex(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "checkguard"}
	c := NewClient(a.Client, owner, Options{})
	ins := []Instance{owner.instance(1, "web"), owner.instance(2, "web")}
	applied, err := c.Apply(ctx, Change{Register: ins})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]Registered{}
	for _, w := range applied.Written {
		have[w.ID] = w
	}
	warn := func(in Instance) Instance { in.Check = Check{Status: StatusWarning, Output: "terminating"}; return in }
	got, err := c.Apply(ctx, Change{Update: []Update{{Want: warn(ins[0]), Have: have[ins[0].ID]}}})
	if err != nil {
		t.Fatal(err)
	}
	if w := got.Written[0]; w.ServiceIndex != have[ins[0].ID].ServiceIndex || w.CheckIndex == have[ins[0].ID].CheckIndex {
		t.Fatalf("check-only update: service index %d -> %d, check index %d -> %d; want the service untouched and the check written",
			have[ins[0].ID].ServiceIndex, w.ServiceIndex, have[ins[0].ID].CheckIndex, w.CheckIndex)
	}
	// Someone re-registers the second instance under our ID (their own
	// tags, no mark); our stale view then tries a readiness change.
	if _, err := a.Client.Catalog().Register(&api.CatalogRegistration{Node: owner.Node().Name, Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &api.AgentService{ID: ins[1].ID, Service: "web", Port: 80, Tags: []string{"theirs"}}}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = c.Apply(ctx, Change{Update: []Update{{Want: warn(ins[1]), Have: have[ins[1].ID]}}})
	var te *TxnError
	if !errors.Is(err, ErrConflict) || !errors.As(err, &te) || len(te.IDs) != 1 || te.IDs[0] != ins[1].ID {
		t.Fatalf("check update of a re-registered entry: err = %v, want a conflict naming %s", err, ins[1].ID)
	}
	checks, _, err := a.Client.Health().Checks("web", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, hc := range checks {
		if hc.ServiceID == ins[1].ID && hc.Status != StatusPassing {
			t.Fatalf("their entry's check was set to %s", hc.Status)
		}
	}
}

// TestLargeChangeNeverDipsBelowDesired: a port change of 300 instances
// (every ID changes: 300 registrations and 300 deletes, several
// transactions) registers first, so after every transaction Consul holds at
// least the 300 desired (new or old) instances.
func TestLargeChangeNeverDipsBelowDesired(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner := testOwner{id: "nodip"}
	var old, next []Instance
	for i := range 300 {
		in := owner.instance(i, "dip")
		old = append(old, in)
		in.ID, in.Port = in.ID+"-8080", 8080
		next = append(next, in)
	}
	setup := NewClient(twin.Client(), owner, Options{})
	applied, err := setup.Apply(ctx, Change{Register: old})
	if err != nil {
		t.Fatal(err)
	}
	var counts []int
	c := NewClient(twin.Client(), owner, Options{Observe: func(_ int, _ float64, err error) {
		if err == nil {
			n, _ := NodeServiceCountForTest(twin.Client(), owner.Node().Name)
			counts = append(counts, n)
		}
	}})
	if _, err := c.Apply(ctx, Change{Register: next, Deregister: applied.Written}); err != nil {
		t.Fatal(err)
	}
	if len(counts) < 4 {
		t.Fatalf("%d transactions, want several", len(counts))
	}
	for i, n := range counts {
		if n < 300 {
			t.Fatalf("after transaction %d of %d Consul held %d instances, fewer than the 300 desired (counts %v)", i+1, len(counts), n, counts)
		}
	}
	if counts[len(counts)-1] != 300 {
		t.Fatalf("final count %d, want 300", counts[len(counts)-1])
	}
	t.Logf("instances after each transaction: %v", counts)
}

// NodeServiceCountForTest counts the services on node.
func NodeServiceCountForTest(c *api.Client, node string) (int, error) {
	list, _, err := c.Catalog().NodeServiceList(node, nil)
	if err != nil || list == nil {
		return 0, err
	}
	return len(list.Services), nil
}

// TestHungRequestCostsTheDeadlineAndFreesItsSlot: with one inflight slot, a
// transaction Consul never answers returns after RequestTimeout with an
// error that says so, and the next transaction gets the slot.
func TestHungRequestCostsTheDeadlineAndFreesItsSlot(t *testing.T) {
	owner := testOwner{id: "hung"}
	twin := consultest.New(t)
	calls := make(chan struct{}, 2)
	twin.SetFault(func(r *http.Request) error { // transactions never get an answer
		if r.URL.Path != "/v1/txn" {
			return nil
		}
		calls <- struct{}{}
		<-r.Context().Done()
		return r.Context().Err()
	})
	c := NewClient(twin.Client(), owner, Options{RequestTimeout: 50 * time.Millisecond, Budget: budget.New(0, 1, 1)})
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := c.Apply(context.Background(), Change{Register: []Instance{owner.instance(i, "web")}})
			errs <- err
		}()
	}
	for range 2 {
		select {
		case err := <-errs:
			if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer from Consul within 50ms") {
				t.Fatalf("hung transaction: err = %v, want the request deadline", err)
			}
		case <-time.After(10 * time.Second): // failsafe, never reached when right
			t.Fatal("a hung transaction held its slot past the deadline")
		}
	}
	if len(calls) != 2 {
		t.Fatalf("%d transactions sent, want 2 (the second got the slot the first freed)", len(calls))
	}
}

// TestTxnErrorNamesTheFailedInstances: a transaction Consul refuses (one
// instance's meta value is too long) says which instance.
func TestTxnErrorNamesTheFailedInstances(t *testing.T) {
	twin := consultest.New(t)
	owner := testOwner{id: "txnerr"}
	c := NewClient(twin.Client(), owner, Options{})
	good, bad := owner.instance(1, "web"), owner.instance(2, "web")
	bad.Meta["k8s-zone"] = strings.Repeat("z", 600)
	_, err := c.Apply(t.Context(), Change{Register: []Instance{good, bad}})
	var te *TxnError
	if !errors.As(err, &te) || len(te.IDs) != 1 || te.IDs[0] != bad.ID || !strings.Contains(err.Error(), bad.ID) {
		t.Fatalf("err = %v, want a TxnError naming %s", err, bad.ID)
	}
}

// errTaken is what fakeGuard refuses writes with once the key is not ours.
var errTaken = errors.New("claimed by someone else")

// fakeGuard is a guard whose check fails until told otherwise.
type fakeGuard struct {
	key     string
	index   uint64
	lost    error
	refresh func() uint64
}

func (g *fakeGuard) Ops() (api.TxnOps, error) {
	if g.lost != nil {
		return nil, g.lost
	}
	return api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: g.key, Index: g.index}}}, nil
}

func (g *fakeGuard) Failed(context.Context) error {
	if g.refresh == nil {
		g.lost = errTaken
		return g.lost
	}
	g.index = g.refresh()
	return nil
}

// TestGuardMakesEveryWriteConditional: with a guard on a KV key, a write
// lands only while the key is at the guarded index; a changed key that the
// guard accepts again is retried once, one it refuses stops every write.
func TestGuardMakesEveryWriteConditional(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "guarded"}
	key := "fleetsync-test/guard"
	index := func() uint64 {
		p, _, err := a.Client.KV().Get(key, nil)
		if err != nil || p == nil {
			t.Fatalf("read %s: %v", key, err)
		}
		return p.ModifyIndex
	}
	if _, err := a.Client.KV().Put(&api.KVPair{Key: key, Value: []byte("ours")}, nil); err != nil {
		t.Fatal(err)
	}
	g := &fakeGuard{key: key, index: index(), refresh: index}
	c := NewClient(a.Client, owner, Options{Guard: g})
	if _, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(1, "web")}}); err != nil {
		t.Fatalf("guarded write: %v", err)
	}
	// The key changes (a replica took the lock): re-checked, accepted, retried.
	if _, err := a.Client.KV().Put(&api.KVPair{Key: key, Value: []byte("ours, locked")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(2, "web")}}); err != nil {
		t.Fatalf("write after an accepted change of the key: %v", err)
	}
	// The key changes again and the guard refuses it: nothing lands.
	if _, err := a.Client.KV().Put(&api.KVPair{Key: key, Value: []byte("theirs")}, nil); err != nil {
		t.Fatal(err)
	}
	g.refresh = nil
	for i := range 2 { // the first finds out, the second is refused before sending
		if _, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(3+i, "web")}}); !errors.Is(err, errTaken) {
			t.Fatalf("write %d after the key was taken: err = %v, want the guard's %v", i, err, errTaken)
		}
	}
	n, err := NodeServiceCountForTest(a.Client, owner.Node().Name)
	if err != nil || n != 2 {
		t.Fatalf("%d instances on our node (%v), want the 2 written while the guard held", n, err)
	}
}

// TestNodeIndexGoesUpWithOurWrites: the node index read by NodeIndex is
// at least what our writes returned (the loss detector's floor).
func TestNodeIndexGoesUpWithOurWrites(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "nodeindex"}
	c := NewClient(a.Client, owner, Options{})
	for i := range 3 {
		if _, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(i, "web")}}); err != nil {
			t.Fatal(err)
		}
		idx, err := c.NodeIndex(ctx, owner.Node().Name)
		if err != nil {
			t.Fatal(err)
		}
		if committed := c.Committed(owner.Node().Name); committed == 0 || idx < committed {
			t.Fatalf("write %d: node index %d, committed %d; want index >= committed > 0", i, idx, committed)
		}
	}
	if _, err := c.NodeIndex(ctx, "k8s-absent"); err != nil {
		t.Fatalf("index of an absent node: %v", err)
	}
}

// TestConcurrentWritesCreateTheNodeOnce: eight workers writing at once to
// a node that does not exist yet (a fresh Consul) cost no failed
// transaction: one creates the node, the others wait for it and then CAS
// on the index it got.
func TestConcurrentWritesCreateTheNodeOnce(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "createonce"}
	var mu sync.Mutex
	failed := 0
	c := NewClient(a.Client, owner, Options{Observe: func(_ int, _ float64, err error) {
		if err != nil {
			mu.Lock()
			failed++
			mu.Unlock()
		}
	}})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			_, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(i, "web")}})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if failed != 0 {
		t.Fatalf("%d failed transactions, want 0", failed)
	}
	if n, err := NodeServiceCountForTest(a.Client, owner.Node().Name); err != nil || n != 8 {
		t.Fatalf("%d instances (%v), want 8", n, err)
	}
}

// lostAnswerAPI commits a transaction and then loses Consul's answer, as a
// connection cut after the commit does.
type lostAnswerAPI struct {
	catalogAPI
	lose *atomic.Bool
}

func (l lostAnswerAPI) CommitTxn(ops api.TxnOps, body []byte, q *api.QueryOptions) (bool, *wire.TxnResponse, error) {
	ok, resp, err := l.catalogAPI.CommitTxn(ops, body, q)
	if l.lose.Load() && err == nil {
		return false, nil, errors.New("read tcp 127.0.0.1:8500: connection reset by peer")
	}
	return ok, resp, err
}

// TestUnansweredWriteWitnessesNothing: a delete that committed without an
// answer retires its entry's witness, or the next check would read the
// entry gone and take it for a loss (the reviewer's finding).
func TestUnansweredWriteWitnessesNothing(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "lostanswer"}
	lose := &atomic.Bool{}
	c := newClient(lostAnswerAPI{catalogAPI: wire.API{C: a.Client}, lose: lose}, owner, Options{})
	in := owner.instance(0, "la")
	applied, err := c.Apply(ctx, Change{Register: []Instance{in}})
	if err != nil {
		t.Fatal(err)
	}
	if ws := c.Witnesses(); len(ws) != 1 || ws[0].ID != in.ID {
		t.Fatalf("witnesses %+v, want %s", ws, in.ID)
	}
	lose.Store(true)
	if _, err := c.Apply(ctx, Change{Deregister: []Registered{applied.Written[0]}}); err == nil {
		t.Fatal("the delete got an answer")
	}
	if ws := c.Witnesses(); len(ws) != 0 {
		t.Fatalf("witnesses after an unanswered delete: %+v", ws)
	}
}

// sendingAPI calls at before every transaction is sent.
type sendingAPI struct {
	catalogAPI
	at func()
}

func (s sendingAPI) CommitTxn(ops api.TxnOps, body []byte, q *api.QueryOptions) (bool, *wire.TxnResponse, error) {
	s.at()
	return s.catalogAPI.CommitTxn(ops, body, q)
}

// TestWriteRetiresItsWitnessBeforeItIsSent: while a write of an entry is
// in flight, the entry's witness no longer stands, so a loss check reading
// the entry as the write commits (at an index the witness does not know,
// or gone) does not take our own write for a loss; once committed, the
// write (or the delete) is the witness.
func TestWriteRetiresItsWitnessBeforeItIsSent(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "sendwit"}
	var c *Client
	var standing []bool // per transaction sent: did the entry's earlier witness still stand?
	var before Witness
	c = newClient(sendingAPI{catalogAPI: wire.API{C: a.Client}, at: func() {
		if before.ID != "" {
			standing = append(standing, c.IsWitness(before))
		}
	}}, owner, Options{})
	in := owner.instance(0, "sw")
	applied, err := c.Apply(ctx, Change{Register: []Instance{in}})
	if err != nil {
		t.Fatal(err)
	}
	before = c.Witnesses()[0]
	moved := in
	moved.Port++
	applied, err = c.Apply(ctx, Change{Update: []Update{{Want: moved, Have: applied.Written[0]}}})
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Witnesses()
	if len(ws) != 1 || ws[0].ID != in.ID || ws[0].Index != applied.Written[0].ServiceIndex || ws[0].Deleted {
		t.Fatalf("after the update, witnesses %+v, want %s at %d", ws, in.ID, applied.Written[0].ServiceIndex)
	}
	before = ws[0]
	if _, err := c.Apply(ctx, Change{Deregister: []Registered{applied.Written[0]}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(standing, []bool{false, false}) {
		t.Fatalf("the entry's witness stood while its write was sent: %v (update, delete)", standing)
	}
	if ws := c.Witnesses(); len(ws) != 1 || ws[0].ID != in.ID || !ws[0].Deleted {
		t.Fatalf("after the delete, witnesses %+v, want %s deleted", ws, in.ID)
	}
}

// TestRefusedWriteKeepsItsWitness: a write Consul refused (a CAS conflict:
// nothing committed) puts back the witness it retired before it was sent,
// or a restore that came just before it (the conflict) would find one
// witness fewer to undo (the review's finding).
func TestRefusedWriteKeepsItsWitness(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "refusedwit"}
	c := NewClient(a.Client, owner, Options{})
	in := owner.instance(0, "rw")
	applied, err := c.Apply(ctx, Change{Register: []Instance{in}})
	if err != nil {
		t.Fatal(err)
	}
	before := c.Witnesses()
	// Someone rewrites the entry (still ours to the eye): our CAS on the
	// index we hold fails.
	reg := &api.CatalogRegistration{Node: applied.Written[0].Node, Address: "127.0.0.1", SkipNodeUpdate: true,
		Service: &api.AgentService{ID: in.ID, Service: in.Name, Address: in.Address, Port: in.Port + 7, Tags: in.Tags, Meta: in.Meta}}
	if _, err := a.Client.Catalog().Register(reg, nil); err != nil {
		t.Fatal(err)
	}
	moved := in
	moved.Port++
	if _, err := c.Apply(ctx, Change{Update: []Update{{Want: moved, Have: applied.Written[0]}}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("update over a rewritten entry: %v, want a conflict", err)
	}
	if after := c.Witnesses(); !slices.Equal(after, before) {
		t.Fatalf("witnesses after a refused write %+v, want %+v", after, before)
	}
}

// queryingAPI records the options of every service-entries read.
type queryingAPI struct {
	catalogAPI
	mu   *sync.Mutex
	seen *[]api.QueryOptions
}

func (q queryingAPI) ServiceEntries(name string, o *api.QueryOptions) ([]*wire.Entry, *api.QueryMeta, error) {
	q.mu.Lock()
	*q.seen = append(*q.seen, *o)
	q.mu.Unlock()
	return q.catalogAPI.ServiceEntries(name, o)
}

// TestWitnessReadIsConsistent: a witness is read with ?consistent (a
// leader elected a moment ago answers default reads before it has applied
// its log, and the witnesses of the writes just before an outage are read
// right when Consul answers again: the review's finding).
func TestWitnessReadIsConsistent(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	owner := testOwner{id: "consistentwit"}
	var mu sync.Mutex
	var seen []api.QueryOptions
	c := newClient(queryingAPI{catalogAPI: wire.API{C: a.Client}, mu: &mu, seen: &seen}, owner, Options{})
	if _, err := c.Apply(ctx, Change{Register: []Instance{owner.instance(0, "cw")}}); err != nil {
		t.Fatal(err)
	}
	if r, err := c.ReadWitness(ctx, c.Witnesses()[0]); err != nil || !r.Found || !r.Ours {
		t.Fatalf("ReadWitness: %+v, %v", r, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || !seen[0].RequireConsistent || seen[0].AllowStale {
		t.Fatalf("witness reads %+v, want one consistent read", seen)
	}
}

// lockGuard guards with a check-index and a check-session of a locked key,
// as the cluster-id claim does: MaxGuardOps ops.
type lockGuard struct {
	key, session string
	index        uint64
}

func (g *lockGuard) Ops() (api.TxnOps, error) {
	return api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: g.key, Index: g.index}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: g.key, Session: g.session}},
	}, nil
}

func (g *lockGuard) Failed(context.Context) error { return errTaken }

// TestPackingKeepsRoomForTheGuard: with a guard of MaxGuardOps ops, no
// transaction is over Consul's 128 ops (the twin refuses more, as Consul
// does): registrations of 2 ops each, a node op and the guard's 2 are 62
// per transaction (127 ops; 63 would be 129), so 300 are 5 transactions.
func TestPackingKeepsRoomForTheGuard(t *testing.T) {
	twin := consultest.New(t)
	c := twin.Client()
	session, _, err := c.Session().Create(&api.SessionEntry{TTL: "1m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := &lockGuard{key: "fleetsync-test/lock", session: session}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: g.key, Value: []byte("ours"), Session: session}, nil); err != nil || !ok {
		t.Fatalf("lock %s: %v %v", g.key, ok, err)
	}
	p, _, err := c.KV().Get(g.key, nil)
	if err != nil || p == nil {
		t.Fatalf("read %s: %v", g.key, err)
	}
	g.index = p.ModifyIndex
	var sizes []int
	owner := testOwner{id: "packed"}
	store := NewClient(c, owner, Options{Guard: g, Observe: func(ops int, _ float64, err error) {
		if err == nil {
			sizes = append(sizes, ops)
		}
	}})
	var ins []Instance
	for i := range 300 {
		ins = append(ins, owner.instance(i, "packed"))
	}
	applied, err := store.Apply(t.Context(), Change{Register: ins})
	if err != nil {
		t.Fatalf("300 guarded registrations: %v", err)
	}
	if want := []int{127, 127, 127, 127, 2 + 1 + 2*(300-4*62)}; applied.Txns != 5 || !slices.Equal(sizes, want) {
		t.Fatalf("%d transactions of %v ops, want %v", applied.Txns, sizes, want)
	}
	if n := len(twin.Services(owner.Node().Name)); n != 300 {
		t.Fatalf("%d instances on the node, want 300", n)
	}
}
