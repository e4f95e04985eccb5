package tok8s

import (
	"slices"
	"testing"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/supervisor/shard"
)

func (g *guarded) running() []string {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	var out []string
	for k := range g.s.workers {
		out = append(out, k.Name)
	}
	slices.Sort(out)
	return out
}

// TestShardsLimitWorkers: with shards, only the units of held shards have
// a worker (and so a health watch); gaining a shard starts its units'
// workers, losing it stops them and returns once they ended; the
// selection itself is every replica's.
func TestShardsLimitWorkers(t *testing.T) {
	const n = 4
	sh := NewShards(n)
	g := newGuardedShards(t, sh)
	names := []string{"a", "b", "c", "d"}
	of := map[string]int{}
	for _, name := range names {
		of[name] = shard.Of(k8s.Key{Namespace: "m", Name: name}, n)
	}
	g.answer(catalog(names...))
	g.want(t, names...)
	if r := g.running(); len(r) != 0 {
		t.Fatalf("workers %v with no shard held", r)
	}
	k := of["a"]
	sh.Gain(k)
	var want []string
	for _, name := range names {
		if of[name] == k {
			want = append(want, name)
		}
	}
	if r := g.running(); !slices.Equal(r, want) {
		t.Fatalf("shard %d held: workers %v, want %v", k, r, want)
	}
	if !sh.Holds(owned.Key{Namespace: "m", Name: "a"}) {
		t.Fatal("Holds(a) false with its shard held")
	}
	sh.Lose(k)
	if r := g.running(); len(r) != 0 {
		t.Fatalf("shard %d lost: workers %v still run", k, r)
	}
	for i := range n {
		sh.Gain(i)
	}
	if r := g.running(); !slices.Equal(r, names) {
		t.Fatalf("every shard held: workers %v, want %v", r, names)
	}
	var none *Shards
	if !none.Holds(owned.Key{Namespace: "m", Name: "a"}) {
		t.Fatal("a nil Shards holds nothing")
	}
}

// TestFeedEmptyIsAnswerWithAFilter: a mirror unit read with a filter
// expression takes an empty health answer (its instances may all be
// filtered out while the name stays in the catalog); without one, an
// empty answer is held for the catalog (the deletion guard) to decide.
func TestFeedEmptyIsAnswerWithAFilter(t *testing.T) {
	g := newGuarded(t)
	if _, cfg := g.s.feed(source{consul: "a", window: -1}); cfg.EmptyIsAnswer {
		t.Error("unfiltered read: EmptyIsAnswer set")
	}
	if _, cfg := g.s.feed(source{consul: "a", window: -1, query: watch.Query{Filter: `Service.Meta.env == "prod"`}}); !cfg.EmptyIsAnswer {
		t.Error("filtered read: EmptyIsAnswer not set")
	}
}
