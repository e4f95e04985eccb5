package k8s

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// sliceServiceIndex indexes EndpointSlices by "namespace/<service name>".
const sliceServiceIndex = "service"

// Handler receives "look again" notifications. Calls must return quickly
// (they run on the informer goroutine).
type Handler interface{ Changed(key Key) }

// Watcher owns one shared Service informer, one shared EndpointSlice
// informer and, as asked, one Node and one Ingress informer, and builds Service views from their caches. See the package
// documentation for what it guarantees.
type Watcher struct {
	log    hclog.Logger
	resync time.Duration

	services  cache.SharedIndexInformer
	slices    cache.SharedIndexInformer
	nodes     cache.SharedIndexInformer // nil when WatcherOptions.Nodes is off
	ingresses cache.SharedIndexInformer // nil when WatcherOptions.Ingresses is off
	synced    []cache.ResourceEventHandlerRegistration

	mu        sync.Mutex
	started   bool
	handler   Handler // written before Start only; read by informer goroutines
	onService func(Key)

	wg sync.WaitGroup
}

// WatcherOptions say which informers a Watcher runs besides Services and
// EndpointSlices.
type WatcherOptions struct {
	Resync time.Duration // informer resync period (0: off)
	// Nodes runs a Node informer (addresses only) for NodePort Services.
	Nodes bool
	// Ingresses runs a networking.k8s.io/v1 Ingress informer (--enable-ingress).
	Ingresses bool
	Log       hclog.Logger
	// OnService, when set, is also told of every add, update and delete
	// of a Service (level-based, like Handler; on an informer goroutine):
	// the Consul -> Kubernetes import mode finds its Services there.
	OnService func(Key)
}

// NewWatcher builds the Service, EndpointSlice and Node informers over the
// whole cluster; nothing runs until Start. resync 0 disables informer
// resync; a positive resync makes every cached object notify again once per
// period.
func NewWatcher(client kubernetes.Interface, resync time.Duration, log hclog.Logger) *Watcher {
	return NewWatcherWith(client, WatcherOptions{Resync: resync, Nodes: true, Log: log})
}

// NewWatcherWith builds a Watcher with the informers opts ask for.
func NewWatcherWith(client kubernetes.Interface, opts WatcherOptions) *Watcher {
	log, resync := opts.Log, opts.Resync
	if log == nil {
		log = hclog.NewNullLogger()
	}
	w := &Watcher{log: log, resync: resync, onService: opts.OnService}
	core, discovery := client.CoreV1(), client.DiscoveryV1()
	w.services = w.informer(client, "Service", &corev1.Service{}, cache.Indexers{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return core.Services(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return core.Services(metav1.NamespaceAll).Watch(ctx, o)
		})
	w.slices = w.informer(client, "EndpointSlice", &discoveryv1.EndpointSlice{},
		cache.Indexers{sliceServiceIndex: sliceIndexFunc, sliceNodeIndex: sliceNodeIndexFunc},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return discovery.EndpointSlices(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return discovery.EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
		})
	w.setup(w.services, "Service", w.serviceHandler(), stripForCache)
	w.setup(w.slices, "EndpointSlice", w.sliceHandler(), compactSlice)
	if opts.Nodes {
		w.nodes = w.informer(client, "Node", &corev1.Node{}, cache.Indexers{},
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.Nodes().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return core.Nodes().Watch(ctx, o)
			})
		w.setup(w.nodes, "Node", w.nodeHandler(), stripNode)
	}
	if opts.Ingresses {
		networking := client.NetworkingV1()
		w.ingresses = w.informer(client, "Ingress", &networkingv1.Ingress{},
			cache.Indexers{ingressServiceIndex: ingressIndexFunc},
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return networking.Ingresses(metav1.NamespaceAll).List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return networking.Ingresses(metav1.NamespaceAll).Watch(ctx, o)
			})
		w.setup(w.ingresses, "Ingress", w.ingressHandler(), stripForCache)
	}
	return w
}

// informer builds the shared informer of one kind over the whole cluster,
// its list and watch made Patient, as client-go's generated informers do
// otherwise (watch-list semantics included).
func (w *Watcher) informer(client kubernetes.Interface, kind string, obj runtime.Object, indexers cache.Indexers,
	list cache.ListWithContextFunc, watchFn cache.WatchFuncWithContext) cache.SharedIndexInformer {
	lw := Patient(&cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn}, kind, nil, w.log)
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), obj,
		cache.SharedIndexInformerOptions{ResyncPeriod: w.resync, Indexers: indexers, ObjectDescription: kind})
}

// informers returns every informer the Watcher runs.
func (w *Watcher) informers() []cache.SharedIndexInformer {
	out := []cache.SharedIndexInformer{w.services, w.slices}
	if w.nodes != nil {
		out = append(out, w.nodes)
	}
	if w.ingresses != nil {
		out = append(out, w.ingresses)
	}
	return out
}

// setup installs the memory transform, the watch error log and the event
// handler on a not yet started informer.
func (w *Watcher) setup(inf cache.SharedIndexInformer, kind string, h cache.ResourceEventHandler, transform cache.TransformFunc) {
	if err := inf.SetTransform(transform); err != nil {
		w.log.Error("Cannot set informer transform", "kind", kind, "error", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(w.watchErrorHandler(kind)); err != nil {
		w.log.Error("Cannot set watch error handler", "kind", kind, "error", err)
	}
	reg, err := inf.AddEventHandler(h)
	if err != nil {
		w.log.Error("Cannot add informer event handler", "kind", kind, "error", err)
		return
	}
	w.synced = append(w.synced, reg)
}

// SetHandler sets the receiver of Changed notifications. It must be called
// before Start; later calls are ignored and logged.
func (w *Watcher) SetHandler(h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		w.log.Error("SetHandler called after Start, ignored")
		return
	}
	w.handler = h
}

// Start runs every informer on goroutines of their own and returns at once.
// They stop when ctx is done; Wait waits for them. A second Start is a
// no-op.
func (w *Watcher) Start(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		w.log.Warn("Watcher already started")
		return
	}
	w.started = true
	for _, inf := range w.informers() {
		w.wg.Go(func() { inf.RunWithContext(ctx) })
	}
}

// Wait blocks until every goroutine started by Start has ended, which
// happens after Start's context is done. It returns at once if Start was
// never called.
func (w *Watcher) Wait() { w.wg.Wait() }

// WaitForSync blocks until every informer has listed their initial state
// and Changed has been called for all of it, or ctx is done. It reports
// whether the sync completed. Before Start it can only end with ctx.
func (w *Watcher) WaitForSync(ctx context.Context) bool {
	checkers := make([]cache.DoneChecker, 0, len(w.synced))
	for _, reg := range w.synced {
		checkers = append(checkers, reg.HasSyncedChecker())
	}
	if len(checkers) != len(w.informers()) {
		return false
	}
	return cache.WaitFor(ctx, "", checkers...)
}

// HasSynced reports, without blocking, whether WaitForSync would return
// true.
func (w *Watcher) HasSynced() bool {
	if len(w.synced) != len(w.informers()) {
		return false
	}
	for _, reg := range w.synced {
		if !reg.HasSynced() {
			return false
		}
	}
	return true
}

// Service builds the view of one Service from the caches, merging all of
// its EndpointSlices. It returns false if the Service is not in the cache.
func (w *Watcher) Service(key Key) (*Service, bool, error) {
	svc, ok, err := w.cachedService(key)
	if err != nil || !ok {
		return nil, false, err
	}
	endpointSlices, err := w.slicesOf(key)
	if err != nil {
		return nil, false, err
	}
	view := newService(svc, endpointSlices)
	if svc.Spec.Type == corev1.ServiceTypeNodePort {
		view.Nodes = w.nodeAddresses(endpointNodes(view.Endpoints))
	}
	view.Ingresses = w.ingressRoutes(key)
	return view, true, nil
}

// Head returns the Service's own fields from the cache (no endpoints,
// nodes or ingress routes: nothing merged), for what needs only those,
// such as whether it is selected. It returns false if the Service is not
// in the cache.
func (w *Watcher) Head(key Key) (*Service, bool, error) {
	svc, ok, err := w.cachedService(key)
	if err != nil || !ok {
		return nil, false, err
	}
	return newService(svc, nil), true, nil
}

// cachedService returns the cached Service object of key.
func (w *Watcher) cachedService(key Key) (*corev1.Service, bool, error) {
	obj, exists, err := w.services.GetIndexer().GetByKey(key.String())
	if err != nil {
		return nil, false, fmt.Errorf("get service %s from cache: %w", key, err)
	}
	if !exists {
		return nil, false, nil
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return nil, false, fmt.Errorf("get service %s from cache: unexpected type %T", key, obj)
	}
	return svc, true, nil
}

// endpointNodes returns the distinct node names of endpoints, in order.
func endpointNodes(eps []Endpoint) []string {
	var out []string
	for _, ep := range eps {
		if ep.Node != "" && !slices.Contains(out, ep.Node) {
			out = append(out, ep.Node)
		}
	}
	return out
}

// slicesOf returns the cached EndpointSlices labelled for key.
func (w *Watcher) slicesOf(key Key) ([]*cachedSlice, error) {
	objs, err := w.slices.GetIndexer().ByIndex(sliceServiceIndex, key.String())
	if err != nil {
		return nil, fmt.Errorf("get endpointslices of %s from cache: %w", key, err)
	}
	out := make([]*cachedSlice, 0, len(objs))
	for _, obj := range objs {
		s, ok := obj.(*cachedSlice)
		if !ok {
			return nil, fmt.Errorf("get endpointslices of %s from cache: unexpected type %T", key, obj)
		}
		out = append(out, s)
	}
	return out, nil
}

// Keys returns the key of every Service in the cache, sorted.
func (w *Watcher) Keys() []Key {
	objs := w.services.GetIndexer().List()
	keys := make([]Key, 0, len(objs))
	for _, obj := range objs {
		if svc, ok := obj.(*corev1.Service); ok {
			keys = append(keys, Key{Namespace: svc.Namespace, Name: svc.Name})
		}
	}
	slices.SortFunc(keys, func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return keys
}

// sliceIndexFunc indexes a slice under the Service its
// kubernetes.io/service-name label names; unlabelled slices are not
// indexed.
func sliceIndexFunc(obj any) ([]string, error) {
	s, ok := obj.(*cachedSlice)
	if !ok {
		return nil, fmt.Errorf("index endpointslice: unexpected type %T", obj)
	}
	key, ok := s.serviceKey()
	if !ok {
		return nil, nil
	}
	return []string{key.String()}, nil
}
