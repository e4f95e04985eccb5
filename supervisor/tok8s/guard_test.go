package tok8s

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

func TestMass(t *testing.T) {
	tests := []struct {
		dropped, mirrored int
		want              bool
	}{
		{0, 0, false}, {1, 1, false}, {1, 2, false}, {2, 2, true}, {2, 4, false}, {3, 4, true}, {3, 5, true}, {50, 100, false}, {51, 100, true},
	}
	for _, tt := range tests {
		if got := Mass(tt.dropped, tt.mirrored); got != tt.want {
			t.Errorf("Mass(%d, %d) = %v, want %v", tt.dropped, tt.mirrored, got, tt.want)
		}
	}
}

// guarded is a supervisor past its gate over four mirrored Services
// (a, b, c, d), its workers parked (the gate stays closed for them), its
// guard running on a fake clock, and a catalog whose re-read answers cur.
type guarded struct {
	s   *Supervisor
	clk *clocktesting.FakeClock
	mu  sync.Mutex
	cur watch.Catalog
}

const testGrace = 30 * time.Second

func newGuarded(t *testing.T) *guarded { return newGuardedShards(t, nil) }

func newGuardedShards(t *testing.T, shards *Shards) *guarded {
	t.Helper()
	mark, err := k8smark.New("c1")
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, n := range []string{"a", "b", "c", "d"} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "m", Name: n, Annotations: map[string]string{k8smark.AnnotationConsulService: n}}}
		mark.Stamp(svc)
		objs = append(objs, svc)
	}
	return guardOver(t, objs, Options{Mirror: true, Namespace: "m", Shards: shards, Config: wtok8s.Config{Mark: mark}})
}

// guardOver runs opts's supervisor past its gate over a fake API server
// holding objs: its workers parked (their health reads block, the gate
// stays closed for them), its guard on a fake clock, and a catalog whose
// re-read answers cur.
func guardOver(t *testing.T, objs []runtime.Object, opts Options) *guarded {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cache := owned.New(fake.NewClientset(objs...), opts.Config.Mark.Selector(), "")
	cache.Start(ctx)
	if !cache.WaitForSync(ctx) {
		t.Fatal("cache did not sync")
	}
	g := &guarded{clk: clocktesting.NewFakeClock(time.Unix(0, 0))}
	opts.Owned, opts.Clock, opts.DeletionGrace = cache, g.clk, testGrace
	opts.Health = func(ctx context.Context, _ string, _ watch.Query, _ uint64) (watch.Instances, uint64, error) {
		<-ctx.Done()
		return watch.Instances{}, 0, ctx.Err()
	}
	opts.Catalog = func(context.Context, uint64) (watch.Catalog, uint64, error) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.cur, 1, nil
	}
	g.s = New(opts)
	if !g.s.loadImports(ctx) {
		t.Fatal("imports not loaded")
	}
	g.s.ctx = ctx
	opts.Shards.attach(g.s)
	done := make(chan struct{})
	go func() { defer close(done); g.s.guardLoop(ctx) }()
	t.Cleanup(func() { cancel(); <-done; g.s.wg.Wait(); cache.Wait() })
	return g
}

func catalog(names ...string) watch.Catalog {
	c := watch.Catalog{Names: map[string][]string{}}
	for _, n := range names {
		c.Names[n] = nil
	}
	return c
}

// answer is a blocking answer of the catalog; re-reads answer the same.
func (g *guarded) answer(c watch.Catalog) {
	g.mu.Lock()
	g.cur = c
	g.mu.Unlock()
	g.s.onCatalog(c, false)
}

func (g *guarded) selected() []string {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	var out []string
	for k := range maps.Keys(g.s.selected) {
		out = append(out, k.Name)
	}
	slices.Sort(out)
	return out
}

func (g *guarded) want(t *testing.T, want ...string) {
	t.Helper()
	if got := g.selected(); !slices.Equal(got, want) {
		t.Fatalf("selected %v, want %v", got, want)
	}
}

// eventually waits for the guard's goroutine to act on a clock step.
func (g *guarded) eventually(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(g.selected(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("selected %v, want %v", g.selected(), want)
		}
		time.Sleep(time.Millisecond) // polling for the guard goroutine's re-read
	}
}

func (g *guarded) waitTimer(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !g.clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the guard armed no timer")
		}
		time.Sleep(time.Millisecond) // polling the fake clock for its waiter
	}
}

// TestGuardHoldsThenRereads: an answer that drops three of four mirrored
// Services keeps them selected; the re-read after the grace period that
// still drops them is taken.
func TestGuardHoldsThenRereads(t *testing.T) {
	g := newGuarded(t)
	g.answer(catalog("a", "b", "c", "d"))
	g.want(t, "a", "b", "c", "d")
	g.answer(catalog("a"))
	g.want(t, "a", "b", "c", "d")
	g.waitTimer(t)
	g.clk.Step(testGrace - time.Second)
	g.want(t, "a", "b", "c", "d")
	g.clk.Step(time.Second)
	g.eventually(t, "a")
}

// TestGuardReleasedByALaterAnswer: Consul back with its services within the
// grace period: the held answer is replaced and nothing is dropped, the
// re-read included.
func TestGuardReleasedByALaterAnswer(t *testing.T) {
	g := newGuarded(t)
	g.answer(catalog("a", "b", "c", "d"))
	g.answer(catalog())
	g.want(t, "a", "b", "c", "d")
	g.waitTimer(t)
	g.answer(catalog("a", "b", "c", "d", "e"))
	g.want(t, "a", "b", "c", "d", "e")
	g.clk.Step(testGrace) // the re-read answers the same
	g.want(t, "a", "b", "c", "d", "e")
}

// TestGuardHoldsThroughAPartialReturn: Consul restarted empty, its
// services registered again one by one: an answer that brings some back
// keeps the rest held until the grace period's re-read, which takes what
// is missing then.
func TestGuardHoldsThroughAPartialReturn(t *testing.T) {
	g := newGuarded(t)
	g.answer(catalog("a", "b", "c", "d"))
	g.answer(catalog())
	g.waitTimer(t)
	g.answer(catalog("a", "b"))
	g.want(t, "a", "b", "c", "d")
	g.answer(catalog("a", "b", "c"))
	g.want(t, "a", "b", "c", "d")
	g.clk.Step(testGrace)
	g.eventually(t, "a", "b", "c")
}

// TestGuardHoldsAnswerFilteredByACLs: an answer Consul filtered for the
// token is held with no re-read, however long it lasts.
func TestGuardHoldsAnswerFilteredByACLs(t *testing.T) {
	g := newGuarded(t)
	g.answer(catalog("a", "b", "c", "d"))
	filtered := catalog("a")
	filtered.FilteredByACLs = true
	g.answer(filtered)
	g.want(t, "a", "b", "c", "d")
	if g.clk.HasWaiters() {
		t.Fatal("a re-read is armed for an answer filtered by ACLs")
	}
	g.clk.Step(10 * testGrace)
	g.want(t, "a", "b", "c", "d")
}

// TestGuardLetsSmallDropsThrough: one name gone, or half of them, is
// dropped at once.
func TestGuardLetsSmallDropsThrough(t *testing.T) {
	g := newGuarded(t)
	g.answer(catalog("a", "b", "c", "d"))
	g.answer(catalog("a", "b", "c"))
	g.want(t, "a", "b", "c")
	g.answer(catalog("a", "b"))
	g.want(t, "a", "b")
}

// TestGuardAtBootstrap: the first answer after a restart that drops most
// of the Services left by the last run holds them, by the Consul names
// their annotations carry.
func TestGuardAtBootstrap(t *testing.T) {
	g := newGuarded(t)
	g.answer(catalog("b"))
	g.want(t, "a", "b", "c", "d")
	g.s.mu.Lock()
	src := g.s.selected[owned.Key{Namespace: "m", Name: "d"}]
	g.s.mu.Unlock()
	if src.consul != "d" || src.window != -1 {
		t.Fatalf("held unit d has source %+v, want Consul name d and the mirror window", src)
	}
}
