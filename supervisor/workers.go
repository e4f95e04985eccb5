package supervisor

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/worker"
)

// wants is the single "is this Service mine" decision: selected, and in a
// shard this replica holds. (A worker's own Lookup leaves shards out: a
// worker whose shard goes is stopped, never told to deregister.)
func (s *Supervisor) wants(key k8s.Key) bool {
	if !s.holds(key) {
		return false
	}
	return s.selected(key)
}

// selected reports whether the Service is in the cache and selected (its
// own fields decide: nothing of its endpoints is merged).
func (s *Supervisor) selected(key k8s.Key) bool {
	svc, ok, err := s.opts.Watcher.Head(key)
	return err == nil && ok && s.opts.Selector.Selected(svc)
}

func (s *Supervisor) lookup(key k8s.Key) (*k8s.Service, bool) {
	svc, ok, err := s.opts.Watcher.Service(key)
	if err != nil || !ok {
		return nil, false
	}
	return svc, s.opts.Selector.Selected(svc)
}

// changed routes an event: notify the Service's worker, or start one.
func (s *Supervisor) changed(key k8s.Key) {
	s.earlyMu.Lock()
	if !s.bootstrapped.Load() {
		// Bootstrap reads the whole cache, but it may have listed it
		// already: it looks at this one again when it is done.
		s.early[key] = true
		s.earlyMu.Unlock()
		return
	}
	s.earlyMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.workers[key]; ok {
		e.w.Notify()
		return
	}
	if s.ctx.Err() == nil && s.wants(key) {
		if w := s.startLocked(key, nil, false); w != nil {
			w.Notify() // the event that made it counts as a change
		}
	}
}

// startLocked starts the worker of key; s.mu is held.
func (s *Supervisor) startLocked(key k8s.Key, owned map[string]worker.Held, ownedKnown bool) *worker.Worker {
	if s.stopping {
		return nil // Run is waiting for the workers: start no more
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	e := &entry{w: s.newWorker(key, owned, ownedKnown), cancel: cancel, done: make(chan struct{})}
	s.workers[key] = e
	s.opts.Hooks.Fleet.WorkerStarted(key)
	s.wg.Add(1)
	go s.runWorker(ctx, key, e)
	return e.w
}

func (s *Supervisor) newWorker(key k8s.Key, owned map[string]worker.Held, ownedKnown bool) *worker.Worker {
	var obs worker.Observer
	if s.opts.ObserverFor != nil {
		obs = s.opts.ObserverFor(key)
	}
	cfg := s.opts.Worker
	if l := s.layout.Load(); l != nil {
		cfg.Cluster = *l
	}
	return worker.New(worker.Options{
		Key:          key,
		Config:       cfg,
		Lookup:       func() (*k8s.Service, bool) { return s.lookup(key) },
		Store:        s.opts.Store,
		Clock:        s.opts.Clock,
		Log:          s.workerLog(),
		Reporter:     s.opts.Reporter,
		Observer:     obs,
		Gate:         s.gate,
		Looks:        s.looks,
		Owned:        owned,
		OwnedKnown:   ownedKnown,
		DrainTimeout: s.opts.DrainTimeout,
		ResyncPeriod: s.opts.ResyncPeriod,
		OnLoss:       func(reason string) { s.lossSeen(key, reason) },
		Fence:        s.fenceOf(key),
		OnName:       func(name string, derived bool) { s.nameSeen(key, name, derived) },
	})
}

// runWorker runs one worker until ctx is done or it finishes; a panic
// restarts it, after a backoff, with its owned state re-read from Consul.
func (s *Supervisor) runWorker(ctx context.Context, key k8s.Key, e *entry) {
	defer s.wg.Done()
	defer close(e.done)
	defer e.cancel(nil)
	for {
		err := safeRun(ctx, e.w)
		if ctx.Err() != nil {
			s.stopped(key, e)
			return
		}
		if errors.Is(err, worker.ErrFinished) {
			s.finished(key, e)
			return
		}
		if errors.Is(err, worker.ErrFenced) {
			s.fenced(key, e)
			return
		}
		e.restarts++
		s.opts.Hooks.Fleet.WorkerRestarted(key)
		s.log.Error("Worker crashed; restarting", "namespace", key.Namespace, "service", key.Name,
			"restarts", e.restarts, "error", err)
		t := s.opts.Clock.NewTimer(restartBackoff.Delay(e.restarts))
		select {
		case <-ctx.Done():
			t.Stop()
			s.stopped(key, e)
			return
		case <-t.C():
		}
		s.mu.Lock()
		e.w = s.newWorker(key, nil, false)
		s.mu.Unlock()
	}
}

// stopped removes a worker that was stopped (its shard handed over, or the
// process stopping). Its Service's entries are another replica's business
// now, which may rewrite or delete them: they witness nothing of this
// process any more. This runs before the entry leaves the map and before
// e.done closes, so no successor of the key has written yet.
func (s *Supervisor) stopped(key k8s.Key, e *entry) {
	s.opts.Store.ForgetWitnesses(s.opts.Worker.Cluster.IDPrefix(key.Namespace, key.Name))
	s.mu.Lock()
	if s.workers[key] == e {
		delete(s.workers, key)
		s.names.remove(key)
	}
	s.mu.Unlock()
	s.opts.Hooks.Fleet.WorkerStopped(key)
}

// finished removes a worker whose Service is gone; if the Service came back
// meanwhile (level-based re-check), a new worker takes over. The deletes
// it committed stay witnesses: a restore of a snapshot taken before them
// brings the entries back, with no worker of their Service left to see
// it, and the loss check is then the only one that can (a write right
// after the restore hides it from the node indexes). A successor or
// another replica that writes the entries again does so at a later index,
// which a delete witness accepts.
func (s *Supervisor) finished(key k8s.Key, e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers[key] == e {
		delete(s.workers, key)
		s.names.remove(key)
	}
	s.opts.Hooks.Fleet.WorkerStopped(key)
	s.log.Debug("Worker finished", "namespace", key.Namespace, "service", key.Name)
	if s.ctx.Err() == nil && s.wants(key) {
		s.startLocked(key, nil, false)
	}
}

// safeRun runs w, turning a panic into an error.
func safeRun(ctx context.Context, w *worker.Worker) (err error) {
	defer func() {
		p := recover()
		if pe, ok := p.(*worker.PanicError); ok {
			err = fmt.Errorf("panic: %w\n%s", pe, pe.Stack) // on a flush's goroutine: its stack
		} else if p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return w.Run(ctx)
}

// Len returns the number of running workers.
func (s *Supervisor) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.workers)
}

// Workers returns a status snapshot of every worker, sorted by key.
func (s *Supervisor) Workers() []worker.Status {
	s.mu.Lock()
	ws := make([]*worker.Worker, 0, len(s.workers))
	for _, e := range s.workers {
		ws = append(ws, e.w)
	}
	s.mu.Unlock()
	out := make([]worker.Status, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.Status())
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Service < out[j].Service
	})
	return out
}

// Worker returns the status of one worker, with its desired instances.
func (s *Supervisor) Worker(key k8s.Key) (worker.Status, bool) {
	s.mu.Lock()
	e, ok := s.workers[key]
	s.mu.Unlock()
	if !ok {
		return worker.Status{}, false
	}
	st := e.w.Status()
	if svc, selected := s.lookup(key); selected {
		if spec, err := worker.Desired(svc, s.opts.Worker); err == nil {
			st.Instances = spec.Instances
		}
	}
	return st, true
}

type handler struct{ s *Supervisor }

func (h handler) Changed(key k8s.Key) { h.s.changed(key) }

func countOwned(m map[k8s.Key]map[string]worker.Held) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}
