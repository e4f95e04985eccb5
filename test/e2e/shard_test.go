package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// replicaSet is N fleetsync replicas of one cluster sharing --shards.
type replicaSet struct {
	e      *env
	shards int
	ds     map[string]*fixture.Daemon
	mu     sync.Mutex
}

func (r *replicaSet) start(id string) *fixture.Daemon {
	r.e.t.Helper()
	d := r.e.daemonFor(r.e.cluster, []string{r.e.ns}, fmt.Sprintf("--shards=%d", r.shards),
		"--lease-namespace="+r.e.ns, "--replica-id="+id)
	r.mu.Lock()
	r.ds[id] = d
	r.mu.Unlock()
	return d
}

func (r *replicaSet) live() map[string]*fixture.Daemon {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*fixture.Daemon{}
	for id, d := range r.ds {
		if d.Running() {
			out[id] = d
		}
	}
	return out
}

type snapshot struct {
	held    map[string][]int
	workers map[string][]string // replica -> services
}

// snap reads /debug/shards and /debug/workers of every live replica at once.
func (r *replicaSet) snap(ctx context.Context) snapshot {
	s := snapshot{held: map[string][]int{}, workers: map[string][]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, d := range r.live() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sh struct{ Held []int }
			var ws []struct{ Service string }
			if _, body, err := d.Get(ctx, "/debug/shards", ""); err == nil {
				_ = json.Unmarshal([]byte(body), &sh)
			}
			if _, body, err := d.Get(ctx, "/debug/workers", ""); err == nil {
				_ = json.Unmarshal([]byte(body), &ws)
			}
			mu.Lock()
			defer mu.Unlock()
			s.held[id] = sh.Held
			for _, w := range ws {
				s.workers[id] = append(s.workers[id], w.Service)
			}
		}()
	}
	wg.Wait()
	return s
}

// heldWithout reports whether the replicas other than id hold every shard.
func (r *replicaSet) heldWithout(ctx context.Context, id string) error {
	held := map[int]bool{}
	for other, ks := range r.snap(ctx).held {
		if other == id {
			continue
		}
		for _, k := range ks {
			held[k] = true
		}
	}
	if len(held) != r.shards {
		return fmt.Errorf("%d of %d shards held by replicas other than %s", len(held), r.shards, id)
	}
	return nil
}

// overlaps lists services that two replicas run workers for.
func (s snapshot) overlaps() []string {
	by := map[string]string{}
	var out []string
	for id, svcs := range s.workers {
		for _, svc := range svcs {
			if other, ok := by[svc]; ok {
				out = append(out, fmt.Sprintf("%s on %s and %s", svc, other, id))
			}
			by[svc] = id
		}
	}
	return out
}

func (s snapshot) counts() string {
	var ids []string
	for id := range s.held {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("%s:%v", id, s.held[id]))
	}
	return strings.Join(parts, " ")
}

// balanced: every shard held exactly once, each live replica holding
// floor or ceil of shards/replicas.
func (s snapshot) balanced(shards int) error {
	n := len(s.held)
	seen := map[int]string{}
	for id, ks := range s.held {
		if len(ks) < shards/n || len(ks) > (shards+n-1)/n {
			return fmt.Errorf("%s holds %d shards", id, len(ks))
		}
		for _, k := range ks {
			if other, ok := seen[k]; ok {
				return fmt.Errorf("shard %d held by %s and %s", k, other, id)
			}
			seen[k] = id
		}
	}
	if len(seen) != shards {
		return fmt.Errorf("%d of %d shards held", len(seen), shards)
	}
	return nil
}

// leaseDuration is the daemon's default --lease-duration.
const leaseDuration = 15 * time.Second

// TestShardsAcrossReplicas: 3 replicas, 8 shards, 200 services. Shards
// balance, no two replicas ever run a worker for the same service (polled
// throughout), a kill -9 is taken over after the lease expires, a rolling
// restart, a container restarted in place and scaling 3 -> 1 -> 3 lose no
// instance and write nothing.
func TestShardsAcrossReplicas(t *testing.T) {
	e := newEnv(t)
	const services, shards = 200, 8
	ports := map[string]int32{"http": 80}
	var wg sync.WaitGroup
	errs := make(chan error, services)
	var names, keys []string
	for i := range services {
		name := fmt.Sprintf("s%03d", i)
		names = append(names, name)
		for _, ep := range fixture.IPs(200+i/200, (i%200)*2, 2) {
			keys = append(keys, fmt.Sprintf("%s/%s:80", name, ep.IP))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, name, map[string]string{optIn: "true"}, ports)); err != nil {
				errs <- err
				return
			}
			errs <- fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(200+i/200, (i%200)*2, 2)))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}

	rs := &replicaSet{e: e, shards: shards, ds: map[string]*fixture.Daemon{}}
	for _, id := range []string{"r1", "r2", "r3"} {
		rs.start(id)
	}
	e.waitCount(consul.Client, len(keys), 60*time.Second)
	settle := func(what string) snapshot {
		var s snapshot
		eventually(t, 40*time.Second, what, func() error {
			s = rs.snap(e.ctx)
			return s.balanced(shards)
		})
		return s
	}
	s := settle("3 replicas balanced")
	t.Logf("3 replicas, 8 shards: %s", s.counts())

	// From here on: watch for overlaps, lost instances and writes.
	var overlaps []string
	stop := make(chan struct{})
	polled := make(chan struct{})
	polls := 0
	go func() {
		defer close(polled)
		for {
			if o := rs.snap(e.ctx).overlaps(); len(o) > 0 {
				overlaps = append(overlaps, o...)
			}
			polls++
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	g := newGuard(t, consul.Client, e.node(), names, keys)
	before := catalogTxns(t)

	// kill -9 r2: its shards move once its leases expire.
	killed := time.Now()
	must(t, rs.ds["r2"].Kill())
	eventually(t, 40*time.Second, "r2's shards taken over", func() error { return rs.heldWithout(e.ctx, "r2") })
	takeover := time.Since(killed)
	// A shard is taken one lease duration after its holder's last renewal
	// was seen (within milliseconds, by the Lease watch), and that renewal
	// came before the kill. The slack covers this test's 25 ms polls of
	// /debug/shards and the takeover's two Lease updates.
	if takeover > leaseDuration+time.Second {
		t.Errorf("kill -9: shards taken over %s after the kill, want within one lease duration (%s)", takeover, leaseDuration)
	}
	eventually(t, 40*time.Second, "balanced after the kill", func() error {
		return rs.snap(e.ctx).balanced(shards)
	})
	balancedAfter := time.Since(killed)
	s = rs.snap(e.ctx)
	t.Logf("kill -9 r2: every shard held by a live replica %s after the kill (lease duration %s), balanced %s after: %s",
		takeover.Round(100*time.Millisecond), leaseDuration, balancedAfter.Round(100*time.Millisecond), s.counts())

	// Rolling restart of the survivors, then r2 comes back.
	for _, id := range []string{"r1", "r3"} {
		start := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- rs.ds[id].Stop() }() // SIGTERM: its shards are handed over
		eventually(t, 40*time.Second, "shards of "+id+" handed over", func() error { return rs.heldWithout(e.ctx, id) })
		handover := time.Since(start)
		must(t, <-stopped)
		exited := time.Since(start)
		settle("shards of " + id + " handed over")
		must(t, rs.ds[id].Restart(e.ctx, false))
		must(t, rs.ds[id].WaitReady(e.ctx, 30*time.Second))
		ready := time.Since(start)
		settle("rebalanced after restarting " + id)
		t.Logf("rolling restart of %s: every shard held by the others %s after SIGTERM; exited %s, ready again %s, balanced with it again %s after",
			id, handover.Round(100*time.Millisecond), exited.Round(100*time.Millisecond), ready.Round(100*time.Millisecond),
			time.Since(start).Round(100*time.Millisecond))
	}
	must(t, rs.ds["r2"].Restart(e.ctx, false))
	must(t, rs.ds["r2"].WaitReady(e.ctx, 30*time.Second))
	s = settle("r2 back")
	t.Logf("r2 back: %s", s.counts())

	// A container restarted in its pod (kill -9, same pod name, so the same
	// replica id): it leads its own shards again as soon as it is up, while
	// nobody else could take them yet (not before a lease duration).
	had := s.held["r1"]
	crashed := time.Now()
	must(t, rs.ds["r1"].Restart(e.ctx, true))
	eventually(t, 40*time.Second, "r1's shards resumed", func() error {
		s := rs.snap(e.ctx)
		if !slices.Equal(s.held["r1"], had) {
			return fmt.Errorf("r1 holds %v, held %v before the crash", s.held["r1"], had)
		}
		return s.balanced(shards)
	})
	resumed := time.Since(crashed)
	if resumed > leaseDuration-5*time.Second {
		t.Errorf("restart in place: r1 led its shards again %s after the kill, want well within one lease duration (%s)", resumed, leaseDuration)
	}
	t.Logf("kill -9 and restart in place of r1: its shards %v led by it again %s after the kill", had, resumed.Round(100*time.Millisecond))

	// Scale 3 -> 1 -> 3.
	must(t, rs.ds["r2"].Stop())
	must(t, rs.ds["r3"].Stop())
	s = settle("1 replica holds everything")
	t.Logf("scaled to 1: %s", s.counts())
	for _, id := range []string{"r2", "r3"} {
		must(t, rs.ds[id].Restart(e.ctx, false)) // Stop above left it stopped; start it again
		must(t, rs.ds[id].WaitReady(e.ctx, 30*time.Second))
	}
	s = settle("3 replicas again")
	t.Logf("scaled back to 3: %s", s.counts())

	close(stop)
	<-polled
	writes := catalogTxns(t) - before
	lost, foreign := g.finish()
	t.Logf("%d overlap polls of all replicas' /debug/workers", polls)
	if len(overlaps) > 0 {
		t.Errorf("two replicas ran workers for one service: %v", overlaps[:min(5, len(overlaps))])
	}
	figures(t, lost, foreign, writes, 0)
}
