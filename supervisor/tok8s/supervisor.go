package tok8s

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s/owned"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

// Catalog is the blocking query on the catalog's service names
// (watch.Client.Services).
type Catalog func(ctx context.Context, index uint64) (watch.Catalog, uint64, error)

// Health is one blocking query on a Consul service's health, narrowed by
// q (watch.Client.HealthQuery).
type Health func(ctx context.Context, name string, q watch.Query, index uint64) (watch.Instances, uint64, error)

// Options build a Supervisor; Config, Catalog, Health, Owned and Writer are
// required.
type Options struct {
	Config    wtok8s.Config
	Mirror    bool   // --to-k8s
	Namespace string // --k8s-write-namespace
	Prefix    string // --k8s-service-prefix
	Filter    Filter
	Query     watch.Query // mirror mode's reads (--to-k8s-require-tag, --to-k8s-filter)
	Catalog   Catalog
	Health    Health
	Owned     *owned.Cache
	Writer    wtok8s.Writer
	Reporter  wtok8s.Reporter
	Log       hclog.Logger
	Clock     clock.Clock
	// Imports, when set, turns import mode on: annotated selectorless
	// Services (see imports.go); call ServiceChanged for every Service
	// change.
	Imports Imports
	// Observe, when set, is told of every worker flush that wrote or failed.
	Observe func(writes int, err error)
	// DeletionGrace is how long a catalog answer that drops most mirrored
	// Services is held before the catalog is read again (guard.go; default
	// DefaultDeletionGrace).
	DeletionGrace time.Duration
	// Metrics, when set, are this fleet's (NewMetrics).
	Metrics *Metrics
	// Shards, when set, limits the workers to the units of the shards
	// this replica holds (shards.go).
	Shards *Shards
}

type running struct {
	w      *wtok8s.Worker
	cancel context.CancelFunc
	done   chan struct{} // closed when the worker's goroutine ended
	src    source
}

// Supervisor runs the Consul -> Kubernetes fleet.
type Supervisor struct {
	opts Options
	log  hclog.Logger
	gate chan struct{}

	mu       sync.Mutex
	ctx      context.Context      // Run's, once the gate is open
	selected map[owned.Key]source // what the workers see: the latest answer, unless the guard holds

	// The deletion guard (guard.go).
	latest       map[owned.Key]source // the latest catalog answer's selection
	names        map[string][]string  // the latest catalog answer's names
	filtered     bool                 // the latest answer was filtered by ACLs
	held         map[owned.Key]bool   // the units the guard holds: dropped mirror units kept, dropped import units
	holding      time.Time            // when the held mass drop began; zero: none held
	heldFiltered bool                 // the hold of a filtered answer was logged
	recheck      chan time.Duration   // the guard's next read, 1-buffered

	imports map[owned.Key]importUnit
	known   chan struct{} // closed at the first catalog answer
	workers map[owned.Key]*running
	wg      sync.WaitGroup
}

// New returns a supervisor; it does nothing until Run.
func New(opts Options) *Supervisor {
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.DeletionGrace <= 0 {
		opts.DeletionGrace = DefaultDeletionGrace
	}
	s := &Supervisor{opts: opts, log: opts.Log, gate: make(chan struct{}), known: make(chan struct{}), recheck: make(chan time.Duration, 1),
		selected: map[owned.Key]source{}, held: map[owned.Key]bool{}, imports: map[owned.Key]importUnit{}, workers: map[owned.Key]*running{}}
	if opts.Metrics != nil {
		opts.Metrics.sup.Store(s)
	}
	return s
}

// Bootstrapped is closed once the gate is open.
func (s *Supervisor) Bootstrapped() <-chan struct{} { return s.gate }

// Run runs the fleet until ctx is done; it returns once every goroutine it
// started has ended.
func (s *Supervisor) Run(ctx context.Context) error {
	s.opts.Shards.attach(s)
	s.opts.Owned.SetHandler(s.changed)
	s.opts.Owned.Start(ctx)
	defer s.opts.Owned.Wait()
	var wg sync.WaitGroup
	defer wg.Wait()
	// Both modes watch the catalog: mirror mode selects from it, and the
	// deletion guard judges import units by it too.
	wg.Add(1)
	go func() {
		defer wg.Done()
		first := true
		watch.Loop(ctx, watch.Fetch[watch.Catalog](s.opts.Catalog), func(c watch.Catalog) {
			s.onCatalog(c, false)
			if first {
				first = false
				close(s.known)
			}
		}, watch.LoopOptions{Clock: s.opts.Clock, OnError: func(err error, n int) {
			if n == 1 || n%10 == 0 {
				s.log.Warn("Consul catalog watch failed; retrying", "failures", n, "error", err)
			}
		}})
	}()
	wg.Add(1)
	go func() { defer wg.Done(); s.guardLoop(ctx) }()
	if !s.opts.Owned.WaitForSync(ctx) || !s.loadImports(ctx) {
		return nil
	}
	select {
	case <-s.known:
	case <-ctx.Done():
		return nil
	}
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	close(s.gate)
	s.judge(false, nil) // the answer in hand, against the objects as they are
	s.log.Info("Consul -> Kubernetes bootstrapped", "units", len(s.units()))
	<-ctx.Done()
	s.wg.Wait()
	return nil
}

// selection is the mirror units of a catalog answer's names.
func (s *Supervisor) selection(names map[string][]string) map[owned.Key]source {
	sel := map[owned.Key]source{}
	if s.opts.Mirror {
		for n, tags := range names {
			if s.opts.Filter.Mirrored(n, tags) {
				sel[owned.Key{Namespace: s.opts.Namespace, Name: Name(s.opts.Prefix, n)}] = source{consul: n, query: s.opts.Query, window: -1}
			}
		}
	}
	return sel
}

// units is every unit: the selected ones and those with marked objects.
func (s *Supervisor) units() map[owned.Key]source {
	s.mu.Lock()
	out := make(map[owned.Key]source, len(s.selected))
	for k, v := range s.selected {
		out[k] = v
	}
	for k, u := range s.imports {
		out[k] = u.src // an import wins over a mirror of the same name
		if u.problem != "" {
			delete(out, k) // a unit only while marked objects are left
		}
	}
	s.mu.Unlock()
	for _, k := range s.opts.Owned.Keys() {
		if _, ok := out[k]; !ok {
			out[k] = source{}
		}
	}
	return out
}

// lookup is a worker's view of its unit.
func (s *Supervisor) lookup(k owned.Key) wtok8s.Lookup {
	return func() (wtok8s.Unit, *corev1.Service, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.unitLocked(k)
	}
}

// unitLocked is unit k as it stands: an import-mode Service, else a
// mirrored Consul name, else a unit with only marked objects left (not
// selected). s.mu is held.
func (s *Supervisor) unitLocked(k owned.Key) (wtok8s.Unit, *corev1.Service, bool) {
	if u, obj, ok, imported := s.importLookup(k); imported {
		return u, obj, ok
	}
	src, ok := s.selected[k]
	return wtok8s.Unit{Namespace: k.Namespace, Name: k.Name, ConsulName: src.consul, Mirror: s.opts.Mirror, PortName: wtok8s.PortName,
		CatalogDecides: s.held[k]}, nil, ok
}

// changed routes a marked object's change to its unit's worker, or starts
// one for a unit that has none.
func (s *Supervisor) changed(k owned.Key) {
	s.mu.Lock()
	r := s.workers[k]
	s.mu.Unlock()
	if r != nil {
		r.w.Notify()
		return
	}
	s.reconcile()
}

// reconcile starts a worker for every unit without one, and restarts one
// whose Consul name changed. Before the gate opens it does nothing.
func (s *Supervisor) reconcile() {
	s.mu.Lock()
	ctx := s.ctx
	s.mu.Unlock()
	if ctx == nil || ctx.Err() != nil {
		return
	}
	units := s.units()
	keys := make([]owned.Key, 0, len(units))
	for k := range units {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		src := units[k]
		if r := s.workers[k]; r != nil {
			switch {
			case r.src != src && src.consul != "":
				r.cancel() // its end starts the new one
			case src.consul == "":
				r.w.Notify() // not selected (any more): its objects go
			}
			continue
		}
		if !s.opts.Shards.Holds(k) {
			continue // another replica's
		}
		s.start(ctx, k, src)
	}
}

// start runs a worker for k; s.mu is held.
func (s *Supervisor) start(ctx context.Context, k owned.Key, src source) {
	wctx, cancel := context.WithCancel(ctx)
	health, cfg := s.feed(src)
	unit, _, _ := s.unitLocked(k)
	unit.ConsulName = src.consul
	var w *wtok8s.Worker
	w = wtok8s.New(wtok8s.Options{
		Unit:   unit,
		Config: cfg, Lookup: s.lookup(k), Health: health, Owned: s.opts.Owned, Writer: s.opts.Writer,
		Reporter: s.opts.Reporter, Log: s.log.Named("to-k8s"), Clock: s.opts.Clock, Gate: s.gate,
		Observe: func(writes int, err error) { s.observe(w.Status(), writes, err) },
	})
	r := &running{w: w, cancel: cancel, src: src, done: make(chan struct{})}
	s.log.Debug("To-k8s worker started", "service", k.String(), "consul_service", src.consul)
	if s.opts.Metrics != nil {
		s.opts.Metrics.started.Inc()
	}
	s.workers[k] = r
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(r.done)
		err := w.Run(wctx)
		cancel()
		s.log.Debug("To-k8s worker ended", "service", k.String())
		s.mu.Lock()
		if s.workers[k] == r {
			delete(s.workers, k)
		}
		s.mu.Unlock()
		if err != nil && !errors.Is(err, wtok8s.ErrFinished) {
			s.log.Error("To-k8s worker failed", "service", k.String(), "error", err)
		}
		s.reconcile()
	}()
}
