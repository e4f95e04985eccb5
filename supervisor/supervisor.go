package supervisor

import (
	"context"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/backoff"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor/loss"
	"github.com/fleetsync/fleetsync/worker"
)

// Watcher is the part of k8s.Watcher the supervisor uses.
type Watcher interface {
	SetHandler(h k8s.Handler)
	Start(ctx context.Context)
	Wait()
	WaitForSync(ctx context.Context) bool
	Service(key k8s.Key) (*k8s.Service, bool, error)
	// Head is Service without the endpoints (for selection: nothing
	// merged).
	Head(key k8s.Key) (*k8s.Service, bool, error)
	Keys() []k8s.Key
}

// Store is every call the supervisor and its workers make to the consul
// client (consul.Client implements it).
type Store interface {
	worker.Store
	// ReadNode reads every entry on the owner's nodes (the bootstrap read).
	ReadNode(ctx context.Context) ([]consul.Registered, error)
	// The loss detection's reads (see Options.NodeCheckInterval).
	loss.Store
	ForeignCheckSource // what the reads above saw of others' checks
}

// Options build a Supervisor. Watcher, Store and Worker.Cluster are required.
type Options struct {
	Selector     Selector
	Worker       worker.Config
	Watcher      Watcher
	Store        Store
	Reporter     worker.Reporter
	Clock        clock.Clock
	Log          hclog.Logger
	DrainTimeout time.Duration // last flush per worker on stop
	ResyncPeriod time.Duration // each worker's anti-entropy period (0: none)
	// NodeCheckInterval is how often the supervisor checks that our node is
	// still in Consul (0: never); when it vanished while we have instances,
	// Consul lost its data and every worker resyncs at once.
	NodeCheckInterval time.Duration
	// StateKey is a Consul KV key nobody writes, read by the node check
	// (Store.KVIndex): Consul answers a missing key
	// with the KV table's index, which moves only on KV writes (rare in
	// most Consuls), so a snapshot restore shows as that index going back
	// even when catalog writes right after the restore raised the nodes'
	// indexes past their old values. "": not read.
	StateKey string
	// Metrics, when set (NewMetrics), receive the fleet's and every
	// worker's measurements; they are the Hooks and ObserverFor, so those
	// must then be unset (New panics otherwise).
	Metrics *Metrics
	// ObserverFor returns the observer of one worker; nil: none (tests;
	// the daemon sets Metrics).
	ObserverFor func(key k8s.Key) worker.Observer
	// Hooks receive fleet-wide measurements, by subject; a nil one: none
	// (tests; the daemon sets Metrics).
	Hooks Hooks
	// Shards splits Services between replicas (see GainShard); 1 (the
	// default) means this process syncs every Service.
	Shards        int
	ConfirmShards func(ctx context.Context, held []int) (lost []int, err error) // the held shards the Leases give others (confirmShards)
	// AutoNodes makes the supervisor choose, at bootstrap, how many Consul
	// nodes the cluster's Services are spread over (see ChooseNodes);
	// false keeps Worker.Cluster's.
	AutoNodes bool
	Fencing   Fencing // the shards' fencing tokens in Consul (see Fencing)
}

// Supervisor runs one worker per synced Service. Create with New, run with
// Run (once).
type Supervisor struct {
	opts Options
	log  hclog.Logger

	bootstrapped atomic.Bool
	gate         chan struct{}
	// early holds the Services that changed while bootstrap listed the
	// cache: startFleet looks at them again once it is done.
	earlyMu sync.Mutex
	early   map[k8s.Key]bool
	loss    atomic.Pointer[loss.Watch] // set by Run before the first worker starts

	names nameIndex // Consul name of every worker's Service

	problemsMu sync.Mutex
	problems   map[string]string // readiness problems by source (e.g. a foreign node)
	checks     foreignCheckState

	mu       sync.Mutex
	ctx      context.Context // Run's context, set before bootstrap ends
	workers  map[k8s.Key]*entry
	stopping bool                 // set once Run waits for its workers; no worker starts after
	shardMu  sync.Mutex           // guards held and fences; never held while taking mu
	held     map[int]bool         // shards held (unused when Options.Shards is 1)
	fences   map[int]consul.Guard // the tokens of the shards held (Fencing)
	wg       sync.WaitGroup

	// nodes is how many Consul nodes new instances are spread over, set
	// at bootstrap before any worker starts (0 before); layout is the
	// workers' cluster with that many nodes (one for all of them: it
	// holds the node names).
	nodes  atomic.Int64
	layout atomic.Pointer[ownership.Cluster]

	wlogOnce sync.Once
	wlog     hclog.Logger

	// looks bounds the workers' looks in progress to the cores (see
	// worker.Options.Looks).
	looks *worker.Slots
}

type entry struct {
	w        *worker.Worker
	restarts int
	cancel   context.CancelCauseFunc
	done     chan struct{} // closed when runWorker returns
}

// New returns a supervisor.
func New(opts Options) *Supervisor {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if m := opts.Metrics; m != nil {
		if opts.Hooks != (Hooks{}) || opts.ObserverFor != nil {
			panic("supervisor: Options.Metrics with Hooks or ObserverFor set")
		}
		h := hooks{m}
		opts.Hooks, opts.ObserverFor = Hooks{Fleet: h, Shards: h, Consul: h}, m.observerFor
	}
	opts.Hooks = opts.Hooks.orNop()
	if opts.Shards < 1 {
		opts.Shards = 1
	}
	s := &Supervisor{opts: opts, log: opts.Log, gate: make(chan struct{}), workers: map[k8s.Key]*entry{},
		held: map[int]bool{}, fences: map[int]consul.Guard{}, early: map[k8s.Key]bool{}, problems: map[string]string{},
		looks: worker.NewSlots(runtime.GOMAXPROCS(0))}
	if opts.Metrics != nil {
		opts.Metrics.attach(s)
	}
	return s
}

// Bootstrapped reports whether the informers synced and the owned state was
// read (the fleet is running).
func (s *Supervisor) Bootstrapped() bool { return s.bootstrapped.Load() }

// BootstrapDone is closed when Bootstrapped becomes true.
func (s *Supervisor) BootstrapDone() <-chan struct{} { return s.gate }

// Run runs the fleet until ctx is done; it returns after every goroutine it
// started has ended. It returns an error only if bootstrap cannot complete
// for a reason other than ctx.
func (s *Supervisor) Run(ctx context.Context) error {
	s.opts.Watcher.SetHandler(handler{s})
	s.opts.Watcher.Start(ctx)
	defer s.opts.Watcher.Wait()
	defer s.waitWorkers()

	start := s.opts.Clock.Now()
	// The owned Consul state is read while the informers list: neither
	// needs the other, and both must be complete before any worker runs.
	type ownedRead struct {
		ownedState
		took time.Duration
		err  error
	}
	readC := make(chan ownedRead, 1)
	go func() {
		st, err := s.readOwned(ctx)
		readC <- ownedRead{st, s.opts.Clock.Since(start), err}
	}()
	if !s.opts.Watcher.WaitForSync(ctx) {
		<-readC
		return nil // ctx done
	}
	s.opts.Hooks.Fleet.InformersSynced()
	s.log.Info("Kubernetes informers synced", "services", len(s.opts.Watcher.Keys()), "duration", s.opts.Clock.Since(start))
	read := <-readC
	if read.err != nil {
		return nil // ctx done
	}
	owned, foreign := read.held, read.foreign
	s.setNodes(read.nodes)
	n := countOwned(owned) // before the workers take their maps
	lw := s.newLossWatch()
	s.loss.Store(lw)
	var d time.Duration
	s.startFleet(ctx, owned, func(at time.Time) {
		d = at.Sub(start)
		s.opts.Hooks.Fleet.Bootstrapped(d, read.took, n, foreign)
	})
	s.log.Info("Fleet bootstrapped", "workers", s.Len(), "owned_instances", n,
		"foreign_entries_on_node", foreign, "owned_state_read", read.took, "duration", d)
	s.runWatches(ctx, lw)
	return nil
}

// resyncAll asks every worker for an anti-entropy pass.
func (s *Supervisor) resyncAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.workers {
		e.w.Resync()
	}
	return len(s.workers)
}

// retryAll ends every worker's backoff (worker.Retry) and returns how
// many workers there are.
func (s *Supervisor) retryAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.workers {
		e.w.Retry()
	}
	return len(s.workers)
}

// The waits of the bootstrap read's retries, and of a crashed worker's
// restarts (counted over the worker's life, never reset: a Service whose
// worker keeps crashing settles at one restart per 30 s).
var (
	readBackoff    = backoff.Policy{Min: 200 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.2}
	restartBackoff = backoff.Policy{Min: time.Second, Max: 30 * time.Second, Jitter: 0.2}
)

// ownedState is a read of our nodes: the owned entries held per Service
// (worker.HoldOwned), how many entries were not ours, and how many nodes
// ours are spread over (UsedNodes).
type ownedState struct {
	held           map[k8s.Key]map[string]worker.Held
	foreign, nodes int
}

// readOwned reads the entries on our nodes (Store.ReadNode: the whole
// fleet's at once, not one read per worker) and groups the owned ones by
// Service, retrying with backoff until it succeeds or ctx is done.
func (s *Supervisor) readOwned(ctx context.Context) (ownedState, error) {
	retry := backoff.New(readBackoff)
	for {
		var entries []consul.Registered
		err := s.recoverRead(readBootstrap, func() (err error) {
			entries, err = s.opts.Store.ReadNode(ctx)
			return err
		})
		if err == nil {
			st := ownedState{nodes: UsedNodes(s.opts.Worker.Cluster, entries)}
			st.held, st.foreign = worker.HoldOwned(s.opts.Worker.Cluster, entries)
			return st, nil
		}
		if ctx.Err() != nil {
			return ownedState{}, ctx.Err()
		}
		s.opts.Hooks.Fleet.BootstrapReadFailed(err)
		wait := retry.Next()
		s.log.Warn("Cannot read owned state from Consul; retrying", "retry_in", wait, "error", err)
		t := s.opts.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ownedState{}, ctx.Err()
		case <-t.C():
		}
	}
}

// startFleet starts a worker for every selected Service and every Service
// with owned instances, then opens the gate; booted is told the time
// before it does (whoever sees the gate open sees what booted did: the
// bootstrap gauges).
func (s *Supervisor) startFleet(ctx context.Context, owned map[k8s.Key]map[string]worker.Held, booted func(time.Time)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx = ctx
	keys := s.opts.Watcher.Keys()
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, key := range keys {
		if s.wants(key) {
			s.startLocked(key, owned[key], true)
		}
	}
	for key, entries := range owned {
		if _, ok := s.workers[key]; !ok && s.holds(key) {
			s.startLocked(key, entries, true)
		}
	}
	s.earlyMu.Lock()
	// The time is taken before the gate opens: 10,000 workers making
	// their first looks at once would delay it by most of a second.
	booted(s.opts.Clock.Now())
	s.bootstrapped.Store(true)
	early := s.early
	s.early = nil
	s.earlyMu.Unlock()
	close(s.gate)
	// Services created, annotated or changed while the cache was listed:
	// start their workers now (a running one looks again when its gate
	// opens anyway).
	for key := range early {
		if _, ok := s.workers[key]; !ok && s.wants(key) {
			if w := s.startLocked(key, owned[key], true); w != nil {
				w.Notify()
			}
		}
	}
}

// selectedCount counts the cluster's selected Services (every shard's: all
// replicas write to the same nodes).
func (s *Supervisor) selectedCount() int {
	selected := 0
	for _, key := range s.opts.Watcher.Keys() {
		if s.selected(key) {
			selected++
		}
	}
	return selected
}

// setNodes fixes, before any worker starts, the number of Consul nodes
// new instances go on: chosen from the selected Services and the nodes
// the owned instances are on (AutoNodes), or Worker.Cluster's, with a
// warning when that is fewer than advised.
func (s *Supervisor) setNodes(inUse int) {
	selected := s.selectedCount()
	n := max(s.opts.Worker.Cluster.Nodes(), 1)
	if s.opts.AutoNodes {
		prev := inUse
		n = ChooseNodes(selected, prev)
		s.log.Info("Consul nodes chosen", "services", selected, "nodes_in_use", prev, "consul_nodes", n)
	} else if selected > ServicesPerNode*n {
		s.log.Warn("More Services per Consul node than advised: each write to a crowded node costs Consul more (cold starts and rollouts slow down); raise --consul-nodes",
			"services", selected, "consul_nodes", n, "advised_consul_nodes", (selected+ServicesPerNode-1)/ServicesPerNode)
	}
	layout, err := s.opts.Worker.Cluster.WithNodes(n)
	if err != nil { // n is 1..MaxNodes: ChooseNodes or the cluster's own
		layout = s.opts.Worker.Cluster
	}
	s.layout.Store(&layout)
	s.nodes.Store(int64(layout.Nodes()))
	s.opts.Hooks.Consul.ConsulNodes(layout.Nodes())
}

// workerLog is the logger the workers derive theirs from: one for all
// (hclog copies a logger for every Named).
func (s *Supervisor) workerLog() hclog.Logger {
	s.wlogOnce.Do(func() { s.wlog = s.log.Named("worker") })
	return s.wlog
}

// consulNodes is the number of nodes new instances go on.
func (s *Supervisor) consulNodes() int {
	if n := s.nodes.Load(); n > 0 {
		return int(n)
	}
	return max(s.opts.Worker.Cluster.Nodes(), 1)
}

// Selector returns the selection rules.
func (s *Supervisor) Selector() Selector { return s.opts.Selector }

// waitWorkers stops new workers from starting, then waits for every worker
// goroutine (they end because Run's context is done).
func (s *Supervisor) waitWorkers() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.wg.Wait()
}
