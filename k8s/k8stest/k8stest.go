package k8stest

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/fleetsync/fleetsync/k8s"
)

// Watcher is safe for concurrent use. The zero value is not; use New.
type Watcher struct {
	mu       sync.Mutex
	services map[k8s.Key]*k8s.Service
	handler  k8s.Handler
	onKeys   func()
	synced   chan struct{}
	once     sync.Once
}

// New returns an empty watcher, not yet synced.
func New() *Watcher {
	return &Watcher{services: map[k8s.Key]*k8s.Service{}, synced: make(chan struct{})}
}

// SetHandler sets the handler told about every Set and Delete.
func (w *Watcher) SetHandler(h k8s.Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handler = h
}

// Start and Wait do nothing: there are no informers to run.
func (w *Watcher) Start(context.Context) {}

// Wait returns at once.
func (w *Watcher) Wait() {}

// WaitForSync blocks until Synced was called (true) or ctx is done (false).
func (w *Watcher) WaitForSync(ctx context.Context) bool {
	select {
	case <-w.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// Synced marks the caches synced (as after the informers' initial lists).
func (w *Watcher) Synced() { w.once.Do(func() { close(w.synced) }) }

// Service returns the view last set for key.
func (w *Watcher) Service(key k8s.Key) (*k8s.Service, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.services[key]
	return s, ok, nil
}

// Head returns the Service held for key without its endpoints, nodes and
// ingress routes, as k8s.Watcher.Head does.
func (w *Watcher) Head(key k8s.Key) (*k8s.Service, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.services[key]
	if !ok || s == nil {
		return nil, false, nil
	}
	h := *s
	h.Endpoints, h.Nodes, h.Ingresses, h.Problems = nil, nil, nil, nil
	return &h, true, nil
}

// Keys lists the Services held, sorted; then it runs the OnKeys hook.
func (w *Watcher) Keys() []k8s.Key {
	w.mu.Lock()
	keys := slices.SortedFunc(maps.Keys(w.services), func(a, b k8s.Key) int {
		if a.Namespace != b.Namespace {
			return cmp.Compare(a.Namespace, b.Namespace)
		}
		return cmp.Compare(a.Name, b.Name)
	})
	hook := w.onKeys
	w.mu.Unlock()
	if hook != nil {
		hook()
	}
	return keys
}

// OnKeys runs f after every Keys listing (say, to create a Service while
// someone lists the cache).
func (w *Watcher) OnKeys(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.onKeys = f
}

// Set stores a Service view (the caller does not change it afterwards) and
// tells the handler.
func (w *Watcher) Set(svc *k8s.Service) {
	w.mu.Lock()
	w.services[svc.Key] = svc
	h := w.handler
	w.mu.Unlock()
	if h != nil {
		h.Changed(svc.Key)
	}
}

// Delete removes a Service and tells the handler.
func (w *Watcher) Delete(key k8s.Key) {
	w.mu.Lock()
	delete(w.services, key)
	h := w.handler
	w.mu.Unlock()
	if h != nil {
		h.Changed(key)
	}
}
