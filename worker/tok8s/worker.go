package tok8s

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/worker/window"
)

// Health is one blocking query on the unit's Consul service (watch.Client.Health).
type Health func(ctx context.Context, name string, index uint64) (watch.Instances, uint64, error)

// Owned is the cached view of the marked objects (k8s/owned.Cache).
type Owned interface {
	Slices(namespace, name string) []*discoveryv1.EndpointSlice
	Service(namespace, name string) (*corev1.Service, bool)
}

// Writer is the one writer of the Kubernetes API (k8s/apply.Writer).
type Writer interface {
	CreateSlice(ctx context.Context, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error)
	UpdateSlice(ctx context.Context, old, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error)
	DeleteSlice(ctx context.Context, old *discoveryv1.EndpointSlice) error
	CreateService(ctx context.Context, svc *corev1.Service) (*corev1.Service, error)
	UpdateService(ctx context.Context, old, svc *corev1.Service) (*corev1.Service, error)
	DeleteService(ctx context.Context, old *corev1.Service) error
	// AdoptService makes an unmarked Service fleetsync's when adopt says
	// so (see k8s/apply.Writer.AdoptService).
	AdoptService(ctx context.Context, svc *corev1.Service, adopt func(old *corev1.Service) (*corev1.Service, error)) (*corev1.Service, error)
	// Prepay takes n writes from the write budget at once and returns a
	// ctx whose writes spend them before waiting again; a ctx that carries
	// prepaid writes gets n more (see k8s/apply.Writer.Prepay).
	Prepay(ctx context.Context, n int) (context.Context, error)
}

// Reporter turns user-fixable problems into Kubernetes Events.
type Reporter interface {
	Warning(obj runtime.Object, reason, message string)
}

// Event reasons.
const (
	ReasonInstanceSkipped = "InstanceSkipped"
	ReasonNameTaken       = "NameTaken"
	ReasonSyncFailed      = "KubernetesSyncFailed"
	ReasonFilteredByACLs  = "ConsulFilteredByACLs"
)

// Lookup returns the unit as the supervisor sees it now, and whether it is
// still selected; a unit not selected has its objects deleted.
type Lookup func() (u Unit, target *corev1.Service, selected bool)

// Options build a Worker; Unit, Config, Lookup, Health, Owned and Writer
// are required.
type Options struct {
	Unit     Unit
	Config   Config
	Lookup   Lookup
	Health   Health
	Owned    Owned
	Writer   Writer
	Reporter Reporter        // default: none
	Log      hclog.Logger    // default: discard
	Clock    clock.Clock     // default: real
	Gate     <-chan struct{} // closed once the fleet may write; nil: open
	// Observe, when set, is told of every flush that wrote or failed.
	Observe func(writes int, err error)
	// MinBackoff and MaxBackoff bound failed flushes' retries (defaults
	// 200ms, 30s).
	MinBackoff, MaxBackoff time.Duration
}

// ErrFinished is returned by Run when the unit is no longer selected and
// none of its objects remain.
var ErrFinished = errors.New("to-k8s worker finished: unit not selected and nothing left")

// Worker keeps one unit's objects equal to its Consul service's instances.
type Worker struct {
	opts    Options
	log     hclog.Logger
	trigger chan struct{}

	stats stats // Status's figures

	mu       sync.Mutex
	entries  []watch.Entry
	filtered bool // Consul said the last answer was filtered by ACLs (hold.go)
	known    bool // a health answer arrived

	// Owned by Run's goroutine: what this worker wrote that the cache
	// may not show yet (name -> resourceVersion written, "" for deleted).
	wrote     map[string]string
	wroteAt   time.Time
	reported  map[string]bool
	takenSeen bool
	holding   bool // a filtered answer keeps endpoints it dropped (hold.go)
}

// New returns a worker; it does nothing until Run.
func New(opts Options) *Worker {
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.Observe == nil {
		opts.Observe = func(int, error) {}
	}
	return &Worker{opts: opts, trigger: make(chan struct{}, 1), wrote: map[string]string{}, reported: map[string]bool{},
		log: opts.Log.With("namespace", opts.Unit.Namespace, "service", opts.Unit.Name, "consul_service", opts.Unit.ConsulName)}
}

// Notify tells the worker to look again; it never blocks.
func (w *Worker) Notify() {
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// Known reports whether the worker's first health answer arrived.
func (w *Worker) Known() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.known
}

func (w *Worker) deliver(a watch.Instances) {
	w.mu.Lock()
	w.entries, w.filtered, w.known = a.Entries, a.FilteredByACLs, true
	w.mu.Unlock()
	w.Notify()
}

// Run keeps the unit in sync until ctx is done (nil) or the unit is gone
// and its objects deleted (ErrFinished). It runs the health watch on one
// goroutine of its own, ended before Run returns.
func (w *Worker) Run(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	if w.opts.Health != nil { // a unit that is not selected reads no health
		wg.Add(1)
		go func() { defer wg.Done(); w.watch(wctx) }()
	}
	if w.opts.Gate != nil {
		select {
		case <-w.opts.Gate:
		case <-ctx.Done():
			return nil
		}
	}
	s := window.Schedule{Window: w.opts.Config.Window, Dirty: true, MinBackoff: w.opts.MinBackoff, MaxBackoff: w.opts.MaxBackoff}
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var timerC <-chan time.Time
		if s.Dirty {
			if wait := s.Wait(w.opts.Clock.Now()); wait <= 0 {
				if timer != nil {
					timer.Stop()
					timer = nil
				}
				s.Dirty = false
				began := w.opts.Clock.Now()
				wrote, done, err := w.flushSafe(ctx)
				if done {
					return ErrFinished
				}
				if wrote > 0 || err != nil {
					s.Flushed(w.opts.Clock.Now(), err)
					w.stats.flushed(began, w.opts.Clock.Now(), wrote, err)
					w.opts.Observe(wrote, err)
					// Look again after the window: the writes may have
					// finished the unit, or the cache may lag them.
					s.Dirty = true
				}
				if err != nil {
					s.Dirty = true
					if ctx.Err() != nil {
						return nil
					}
					w.log.Warn("Flush failed; will retry", "failures", s.Failures, "error", err)
				}
				continue
			} else if timer == nil {
				timer = w.opts.Clock.NewTimer(wait)
			}
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.trigger:
			s.Dirty = true
		case <-timerC:
			timer = nil
		}
	}
}

// flushSafe is flush with a panic turned into an error.
func (w *Worker) flushSafe(ctx context.Context) (wrote int, done bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("to-k8s worker panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return w.flush(ctx)
}

// watch runs the unit's health watch until ctx is done.
func (w *Worker) watch(ctx context.Context) {
	var last watch.Instances // the last answer delivered
	fetch := func(ctx context.Context, index uint64) (watch.Instances, uint64, error) {
		return w.read(ctx, index, last)
	}
	deliver := func(a watch.Instances) { last = a; w.deliver(a) }
	watch.Loop(ctx, fetch, deliver, watch.LoopOptions{Clock: w.opts.Clock, OnError: func(err error, n int) {
		if n == 1 || n%10 == 0 {
			w.log.Warn("Consul health watch failed; retrying", "failures", n, "error", err)
		}
	}})
}
