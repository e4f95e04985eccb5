package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/ownership"
)

type replica struct {
	fences *Fences
	store  *consul.Client
	fenced *atomic.Int64 // OnFenced calls
}

func newReplica(t *testing.T, twin *consultest.Server, owner ownership.Cluster, id string) replica {
	t.Helper()
	n := &atomic.Int64{}
	return replica{
		fences: New(twin.Client(), Options{ClusterID: owner.ID(), Holder: id, OnFenced: func(int) { n.Add(1) }}),
		store:  consul.NewClient(twin.Client(), owner, consul.Options{}),
		fenced: n,
	}
}

func instances(owner ownership.Cluster, from, n int) []consul.Instance {
	var out []consul.Instance
	for i := from; i < from+n; i++ {
		addr := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		out = append(out, owner.Stamp(consul.Instance{ID: owner.InstanceID("ns", "web", addr, 80), Name: "web", Address: addr, Port: 80,
			Check: consul.Check{Status: consul.StatusPassing}}))
	}
	return out
}

func ids(rs []consul.Registered) map[string]bool {
	out := map[string]bool{}
	for _, r := range rs {
		out[r.ID] = true
	}
	return out
}

// TestStaleFenceRefusesTheWholeTransaction: replica A takes shard 3's
// fence and writes; B takes the shard (the next generation). A's next
// transaction (a delete of an instance B did not touch, and a
// registration) is refused whole: nothing of it lands, the error matches
// ErrFenced and not ErrConflict, it is counted once, and a second Apply of
// A's is refused before anything is sent. B writes on.
func TestStaleFenceRefusesTheWholeTransaction(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner, err := ownership.New("fenced")
	if err != nil {
		t.Fatal(err)
	}
	a, b := newReplica(t, twin, owner, "a"), newReplica(t, twin, owner, "b")
	ta, err := a.fences.Take(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	ins := instances(owner, 0, 4)
	if _, err := a.store.Apply(ctx, consul.Change{Register: ins[:2], Fence: ta}); err != nil {
		t.Fatalf("A's write under its own fence: %v", err)
	}
	read, err := a.store.ReadNode(ctx)
	if err != nil || len(read) != 2 {
		t.Fatalf("read %d entries (%v), want 2", len(read), err)
	}

	tb, err := b.fences.Take(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Generation() != ta.Generation()+1 {
		t.Fatalf("B took generation %d after A's %d", tb.Generation(), ta.Generation())
	}
	if _, err := b.store.Apply(ctx, consul.Change{Register: ins[2:3], Fence: tb}); err != nil {
		t.Fatalf("B's write under the new fence: %v", err)
	}

	before := twin.Txns()
	var gone consul.Registered
	for _, r := range read {
		if r.ID == ins[0].ID {
			gone = r
		}
	}
	_, err = a.store.Apply(ctx, consul.Change{Register: ins[3:], Deregister: []consul.Registered{gone}, Fence: ta})
	var te *consul.TxnError
	if !errors.Is(err, consul.ErrFenced) || errors.Is(err, consul.ErrConflict) || !errors.As(err, &te) || !te.Fence {
		t.Fatalf("A's stale write: err = %v, want a *TxnError on the fence matching ErrFenced and not ErrConflict", err)
	}
	if n := a.fenced.Load(); n != 1 {
		t.Fatalf("OnFenced called %d times, want 1", n)
	}
	_, err = a.store.Apply(ctx, consul.Change{Register: ins[3:], Fence: ta})
	if !errors.Is(err, consul.ErrFenced) {
		t.Fatalf("A's second write: err = %v, want ErrFenced", err)
	}
	if sent := twin.Txns() - before; sent != 1 {
		t.Fatalf("%d transactions reached Consul after B took the shard, want 1 (A's first, refused; the second never sent)", sent)
	}
	if n := a.fenced.Load(); n != 1 {
		t.Fatalf("OnFenced called %d times after the second refusal, want 1", n)
	}
	now, err := b.store.ReadNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	have := ids(now)
	if len(now) != 3 || !have[ins[0].ID] || !have[ins[1].ID] || !have[ins[2].ID] {
		t.Fatalf("catalog holds %v, want A's first two (the stale delete refused) and B's one, not A's stale registration", have)
	}
	if _, err := b.store.Apply(ctx, consul.Change{Register: ins[3:], Fence: tb}); err != nil {
		t.Fatalf("B's write after A was fenced: %v", err)
	}
}

// TestFenceKeptAcrossLossAndRewrite: a token whose key Consul lost is
// written again at its generation and the write retried; one whose key
// was rewritten at the same generation and holder adopts the new index.
// Neither is fenced.
func TestFenceKeptAcrossLossAndRewrite(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner, err := ownership.New("lossy")
	if err != nil {
		t.Fatal(err)
	}
	a := newReplica(t, twin, owner, "a")
	tok, err := a.fences.Take(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	ins := instances(owner, 0, 3)
	kv := twin.Client().KV()
	key := Key("", owner.ID(), 0)
	if _, err := kv.Delete(key, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.store.Apply(ctx, consul.Change{Register: ins[:1], Fence: tok}); err != nil {
		t.Fatalf("write after the fence key was lost: %v", err)
	}
	p, _, err := kv.Get(key, nil)
	if err != nil || p == nil {
		t.Fatalf("fence key after the loss: %v %v", p, err)
	}
	var v Value
	if err := json.Unmarshal(p.Value, &v); err != nil || v.Holder != "a" || v.Generation != tok.Generation() {
		t.Fatalf("fence key written again as %s (%v), want holder a at generation %d", p.Value, err, tok.Generation())
	}
	v.TakenAt = v.TakenAt.Add(1) // same holder and generation, new index
	b, _ := json.Marshal(v)
	if _, err := kv.Put(&api.KVPair{Key: key, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.store.Apply(ctx, consul.Change{Register: ins[1:2], Fence: tok}); err != nil {
		t.Fatalf("write after the fence key was rewritten at its generation: %v", err)
	}
	if n := a.fenced.Load(); n != 0 {
		t.Fatalf("OnFenced called %d times, want 0", n)
	}
}

// TestFenceOpChangesPacking: the fence has its ops kept in every
// transaction, so 124 registrations (2 ops each, one node op,
// consul.MaxGuardOps kept for the claim and as many for the fence) take 2
// transactions unfenced (62 each) and 3 fenced (61, 61, 2).
func TestFenceOpChangesPacking(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			twin := consultest.New(t)
			owner, err := ownership.New("packed")
			if err != nil {
				t.Fatal(err)
			}
			a := newReplica(t, twin, owner, "a")
			ch := consul.Change{Register: instances(owner, 0, 124)}
			want := 2
			if fenced {
				if ch.Fence, err = a.fences.Take(t.Context(), 1); err != nil {
					t.Fatal(err)
				}
				want = 3
			}
			applied, err := a.store.Apply(t.Context(), ch)
			if err != nil {
				t.Fatal(err)
			}
			if applied.Txns != want || applied.Registered != 124 {
				t.Fatalf("%d transactions, %d registered; want %d, 124", applied.Txns, applied.Registered, want)
			}
		})
	}
}

// TestTakeBumpsTheGeneration: every Take writes the next generation
// naming its holder, under the cluster's claim prefix.
func TestTakeBumpsTheGeneration(t *testing.T) {
	twin := consultest.New(t)
	f := New(twin.Client(), Options{Prefix: "custom/", ClusterID: "c1", Holder: "r1"})
	for want := uint64(1); want <= 3; want++ {
		tok, err := f.Take(t.Context(), 5)
		if err != nil {
			t.Fatal(err)
		}
		if tok.Generation() != want || tok.Shard() != 5 {
			t.Fatalf("Take %d: generation %d shard %d", want, tok.Generation(), tok.Shard())
		}
	}
	p, _, err := twin.Client().KV().Get("custom/c1/shards/5", nil)
	if err != nil || p == nil {
		t.Fatalf("fence key: %v %v", p, err)
	}
}

// TestFenceLostThenTakenByAnotherRefusesTheOlder: replica A took shard 2
// at generation 3; Consul loses the key (rebuilt empty) and replica B
// takes the shard after A did, at generation 1. A's next transaction (a
// stale delete) is refused and fenced: the key names another replica that
// took it later, so A does not write its higher generation back over B's
// (which would let A's delete through and fence B, the shard's holder).
// B writes on.
func TestFenceLostThenTakenByAnotherRefusesTheOlder(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner, err := ownership.New("rebuilt")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	a, b := newReplica(t, twin, owner, "a"), newReplica(t, twin, owner, "b")
	a.fences.opts.Now, b.fences.opts.Now = clock, clock
	var ta *Token
	for range 3 {
		if ta, err = a.fences.Take(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
	ins := instances(owner, 0, 2)
	if _, err := a.store.Apply(ctx, consul.Change{Register: ins, Fence: ta}); err != nil {
		t.Fatal(err)
	}
	read, err := a.store.ReadNode(ctx)
	if err != nil || len(read) != 2 {
		t.Fatalf("read %d entries (%v), want 2", len(read), err)
	}
	kv := twin.Client().KV()
	key := Key("", owner.ID(), 2)
	if _, err := kv.Delete(key, nil); err != nil { // Consul lost the key
		t.Fatal(err)
	}
	now = now.Add(time.Minute) // A froze past its Lease; B took the shard
	tb, err := b.fences.Take(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Generation() != 1 {
		t.Fatalf("B took generation %d of a lost key, want 1", tb.Generation())
	}

	_, err = a.store.Apply(ctx, consul.Change{Deregister: read[:1], Fence: ta})
	if !errors.Is(err, consul.ErrFenced) {
		t.Fatalf("A's stale delete after B took the lost key: err = %v, want ErrFenced", err)
	}
	if n := a.fenced.Load(); n != 1 {
		t.Fatalf("A's OnFenced called %d times, want 1", n)
	}
	p, _, err := kv.Get(key, nil)
	if err != nil || p == nil {
		t.Fatalf("fence key: %v %v", p, err)
	}
	var v Value
	if err := json.Unmarshal(p.Value, &v); err != nil || v.Holder != "b" || v.Generation != 1 {
		t.Fatalf("fence key holds %s (%v), want B's generation 1", p.Value, err)
	}
	if left, err := b.store.ReadNode(ctx); err != nil || len(left) != 2 {
		t.Fatalf("catalog holds %d entries (%v), want 2: A's stale delete must not land", len(left), err)
	}
	if _, err := b.store.Apply(ctx, consul.Change{Deregister: read[:1], Fence: tb}); err != nil {
		t.Fatalf("B's write under its fence: %v", err)
	}
	if n := b.fenced.Load(); n != 0 {
		t.Fatalf("B's OnFenced called %d times, want 0", n)
	}
}

// TestFenceRolledBackToAnotherOlderTake: Consul restored to a snapshot
// whose fence key names replica B at an older generation, taken before A's
// token: A, the holder, writes its own generation back and writes on,
// not fenced.
func TestFenceRolledBackToAnotherOlderTake(t *testing.T) {
	twin := consultest.New(t)
	ctx := t.Context()
	owner, err := ownership.New("restored")
	if err != nil {
		t.Fatal(err)
	}
	then := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a := newReplica(t, twin, owner, "a")
	a.fences.opts.Now = func() time.Time { return then.Add(time.Minute) }
	for range 2 {
		if _, err := a.fences.Take(ctx, 4); err != nil {
			t.Fatal(err)
		}
	}
	ta, err := a.fences.Take(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := json.Marshal(Value{Holder: "b", Generation: ta.Generation() - 1, TakenAt: then})
	key := Key("", owner.ID(), 4)
	if _, err := twin.Client().KV().Put(&api.KVPair{Key: key, Value: old}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.store.Apply(ctx, consul.Change{Register: instances(owner, 0, 1), Fence: ta}); err != nil {
		t.Fatalf("A's write after the key rolled back to B's older take: %v", err)
	}
	if n := a.fenced.Load(); n != 0 {
		t.Fatalf("OnFenced called %d times, want 0", n)
	}
	p, _, err := twin.Client().KV().Get(key, nil)
	var v Value
	if err != nil || p == nil || json.Unmarshal(p.Value, &v) != nil || v.Holder != "a" || v.Generation != ta.Generation() {
		t.Fatalf("fence key after the rollback: %v %v, want A's generation %d", p, err, ta.Generation())
	}
}
