package supervisor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/worker"
)

func TestParsePerWorker(t *testing.T) {
	for in, want := range map[string]PerWorker{"all": {All: true}, "none": {}, "top-5": {TopK: 5}} {
		got, err := ParsePerWorker(in)
		if err != nil || got != want {
			t.Errorf("ParsePerWorker(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "top-0", "top-x", "some", "top--1"} {
		if _, err := ParsePerWorker(bad); err == nil {
			t.Errorf("ParsePerWorker(%q) accepted", bad)
		}
	}
}

// failingStore fails the next n applies.
type failingStore struct {
	*memStore
	fail int
}

func (f *failingStore) Apply(ctx context.Context, ch consul.Change) (consul.Applied, error) {
	f.mu.Lock()
	if f.fail > 0 {
		f.fail--
		f.mu.Unlock()
		f.changed <- struct{}{}
		return consul.Applied{}, errors.New("consul: 500 internal error")
	}
	f.mu.Unlock()
	return f.memStore.Apply(ctx, ch)
}

func startWithMetrics(t *testing.T, w *fakeWatcher, store Store, per PerWorker) (*fixture, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, per)
	f := startOptions(t, w, store, func(o *Options) { o.Metrics = m }, nil)
	return f, reg
}

func workerSeries(t *testing.T, reg *prometheus.Registry, name, svc string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.Metric {
			for _, l := range m.Label {
				if l.GetName() == "service" && l.GetValue() == svc {
					switch {
					case m.Gauge != nil:
						return m.Gauge.GetValue(), true
					case m.Counter != nil:
						return m.Counter.GetValue(), true
					case m.Histogram != nil:
						return float64(m.Histogram.GetSampleCount()), true
					}
				}
			}
		}
	}
	return 0, false
}

// TestPerWorkerMetricsFollowTheWorker: series appear with the worker, move
// on flushes and errors, and vanish when the Service is deleted.
func TestPerWorkerMetricsFollowTheWorker(t *testing.T) {
	w := newFakeWatcher()
	store := &failingStore{memStore: newMemStore(), fail: 1}
	close(w.synced)
	f, reg := startWithMetrics(t, w, store, PerWorker{All: true})
	f.waitFor(t, "bootstrap", f.sup.Bootstrapped)
	key := k8s.Key{Namespace: "ns", Name: "a"}
	w.set(key, service("ns", "a", "10.0.0.1", "10.0.0.2"))
	// First apply fails, the retry (after backoff) lands.
	f.waitFor(t, "two instances after a retry", func() bool { return store.count("") == 2 })
	f.waitFor(t, "metrics of the flush", func() bool {
		v, _ := workerSeries(t, reg, "fleetsync_worker_registered_instances", "a")
		return v == 2
	})
	for name, want := range map[string]float64{
		"fleetsync_worker_desired_instances":      2,
		"fleetsync_worker_flush_errors_total":     1,
		"fleetsync_worker_retries_total":          1,
		"fleetsync_worker_flushes_total":          2,
		"fleetsync_worker_events_total":           1,
		"fleetsync_worker_change_latency_seconds": 1,
		"fleetsync_worker_flush_coalesced_events": 2,
		"fleetsync_worker_pending":                0,
	} {
		if got, ok := workerSeries(t, reg, name, "a"); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	if got := testutil.ToFloat64(f.sup.opts.Hooks.Fleet.(hooks).m.flushErrors); got != 1 {
		t.Errorf("fleet flush errors = %v, want 1", got)
	}
	w.set(key, nil)
	f.waitFor(t, "worker gone", func() bool { return f.sup.Len() == 0 })
	if _, ok := workerSeries(t, reg, "fleetsync_worker_desired_instances", "a"); ok {
		t.Error("series of a deleted Service still exported")
	}
	if n := testutil.CollectAndCount(reg, "fleetsync_fleet_instance_writes_total"); n != 3 {
		t.Errorf("fleet instance writes series = %d, want 3 kinds", n)
	}
}

// TestPerWorkerNoneAndTopK: none exports no per-worker series and complete
// fleet series; top-K exports the K busiest.
func TestPerWorkerNoneAndTopK(t *testing.T) {
	for _, tc := range []struct {
		per  PerWorker
		want int
	}{{PerWorker{}, 0}, {PerWorker{TopK: 1}, 1}, {PerWorker{All: true}, 3}} {
		w := newFakeWatcher()
		store := newMemStore()
		for _, n := range []string{"a", "b", "c"} {
			w.services[k8s.Key{Namespace: "ns", Name: n}] = service("ns", n, "10.0.0.1")
		}
		close(w.synced)
		f, reg := startWithMetrics(t, w, store, tc.per)
		f.waitFor(t, "3 instances", func() bool { return store.count("") == 3 })
		f.waitFor(t, "idle", func() bool { return idleWorkers(t, reg) == 3 })
		if got := testutil.CollectAndCount(reg, "fleetsync_worker_desired_instances"); got != tc.want {
			t.Errorf("%+v: %d per-worker series, want %d", tc.per, got, tc.want)
		}
		if got := testutil.CollectAndCount(reg, "fleetsync_fleet_flushes_total", "fleetsync_supervisor_workers_started_total",
			"fleetsync_supervisor_bootstrapped", "fleetsync_fleet_change_latency_seconds"); got != 4 {
			t.Errorf("%+v: fleet series = %d, want 4", tc.per, got)
		}
		f.stop()
	}
}

// idleWorkers reads fleetsync_fleet_workers{state="idle"}.
func idleWorkers(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != "fleetsync_fleet_workers" {
			continue
		}
		for _, m := range fam.Metric {
			for _, l := range m.Label {
				if l.GetName() == "state" && l.GetValue() == "idle" {
					return m.Gauge.GetValue()
				}
			}
		}
	}
	return -1
}

// TestTopKRanksTroubleThenRecentActivity: top-K exports the workers in
// trouble first, then those most active since the last scrape, then the
// most active in all; a worker busy long ago gives way to one busy now.
func TestTopKRanksTroubleThenRecentActivity(t *testing.T) {
	m := &Metrics{perWorker: PerWorker{TopK: 2}}
	st := func(name string, events uint64, state worker.State, blocked int) worker.Status {
		return worker.Status{Namespace: "ns", Service: name, Events: events, State: state, Blocked: blocked}
	}
	names := func(sts []worker.Status) string {
		var out []string
		for _, s := range sts {
			out = append(out, s.Service)
		}
		return strings.Join(out, ",")
	}
	for i, tc := range []struct {
		sts  []worker.Status
		want string
	}{
		// First scrape: everything is recent; the backing-off worker first.
		{[]worker.Status{st("a", 100, worker.StateIdle, 0), st("b", 5, worker.StateIdle, 0), st("c", 1, worker.StateBackingOff, 0)}, "c,a"},
		// b changed 10 times since; a and c not at all (c recovered): a
		// has more in all.
		{[]worker.Status{st("a", 100, worker.StateIdle, 0), st("b", 15, worker.StateIdle, 0), st("c", 1, worker.StateIdle, 0)}, "b,a"},
		// A worker blocked by someone else's entries is in trouble.
		{[]worker.Status{st("a", 100, worker.StateIdle, 0), st("b", 16, worker.StateIdle, 0), st("c", 1, worker.StateIdle, 1)}, "c,b"},
		// Nothing changed: the most active in all.
		{[]worker.Status{st("a", 100, worker.StateIdle, 0), st("b", 16, worker.StateIdle, 0), st("c", 1, worker.StateIdle, 0)}, "a,b"},
	} {
		if got := names(m.selectWorkers(tc.sts)); got != tc.want {
			t.Errorf("scrape %d: top-2 = %s, want %s", i+1, got, tc.want)
		}
	}
}

// TestMetricsAreAnOption: metrics given in Options report the fleet from
// New on (the collector is registered by NewMetrics, before any
// supervisor exists); one Metrics serves one supervisor, and Hooks or
// ObserverFor beside it are refused rather than silently overridden.
func TestMetricsAreAnOption(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, PerWorker{All: true})
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gather before any supervisor: %v", err)
	}
	cluster, _ := ownership.New("test")
	opts := Options{Worker: worker.Config{Cluster: cluster}, Watcher: newFakeWatcher(), Store: newMemStore(), Metrics: m}
	sup := New(opts)
	h := sup.opts.Hooks
	for _, got := range []any{h.Fleet, h.Shards, h.Consul} {
		if _, ok := got.(hooks); !ok || sup.opts.ObserverFor == nil || m.sup.Load() != sup {
			t.Fatalf("New did not wire the metrics: hooks %T, observer %v", got, sup.opts.ObserverFor != nil)
		}
	}
	mustPanic := func(what string, o Options) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: New did not panic", what)
			}
		}()
		New(o)
	}
	mustPanic("a second supervisor", opts)
	withHooks := opts
	withHooks.Metrics, withHooks.Hooks.Shards = NewMetrics(prometheus.NewRegistry(), PerWorker{}), nopHooks{}
	mustPanic("Metrics and Hooks", withHooks)
}

// slowRead is a memStore whose whole-fleet read takes took on clk; read
// is closed once it returned.
// sinceClock signals each Since: the only one before the informers sync
// is the one that times the owned-state read.
type sinceClock struct {
	*clocktesting.FakeClock
	since chan struct{}
}

func (c sinceClock) Since(t time.Time) time.Duration {
	d := c.FakeClock.Since(t)
	select {
	case c.since <- struct{}{}:
	default:
	}
	return d
}

type slowRead struct {
	*memStore
	clk  *clocktesting.FakeClock
	took time.Duration
	read chan struct{}
}

func (s *slowRead) ReadNode(ctx context.Context) ([]consul.Registered, error) {
	defer close(s.read)
	s.clk.Step(s.took)
	return s.memStore.ReadNode(ctx)
}

// TestBootstrapMetricsTimeTheRead: the bootstrap gauges give the time to a
// bootstrapped fleet and, on its own, the time the owned-state read took.
func TestBootstrapMetricsTimeTheRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, PerWorker{})
	cluster, _ := ownership.New("test")
	clk := clocktesting.NewFakeClock(time.Now())
	timed := sinceClock{clk, make(chan struct{}, 1)}
	w := newFakeWatcher()
	store := &slowRead{newMemStore(), clk, 3 * time.Second, make(chan struct{})}
	sup := New(Options{Worker: worker.Config{Cluster: cluster}, Watcher: w, Store: store, Metrics: m, Clock: timed})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-store.read
	<-timed.since             // the read's duration taken (before, a Step racing it made it 5 s now and then)
	clk.Step(2 * time.Second) // the informers sync 2 s after the read
	close(w.synced)
	select {
	case <-sup.BootstrapDone():
	case <-time.After(10 * time.Second):
		t.Fatal("no bootstrap")
	}
	if got := testutil.ToFloat64(m.bootstrapRead); got != 3 {
		t.Errorf("fleetsync_supervisor_bootstrap_read_duration_seconds = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.bootstrapSecs); got != 5 {
		t.Errorf("fleetsync_supervisor_bootstrap_duration_seconds = %v, want 5", got)
	}
}
