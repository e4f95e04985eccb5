package owned

import (
	"context"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Key names one Service.
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

const byService = "service"

// Cache holds the marked Services and EndpointSlices.
type Cache struct {
	factory  informers.SharedInformerFactory
	slices   cache.SharedIndexInformer
	services cache.SharedIndexInformer

	mu      sync.RWMutex
	handler func(Key)
}

// New returns the cache of the objects matching selector (a label
// selector), in namespace ("" for all); it does nothing until Start.
func New(client kubernetes.Interface, selector, namespace string) *Cache {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	c := &Cache{factory: f, slices: f.Discovery().V1().EndpointSlices().Informer(), services: f.Core().V1().Services().Informer()}
	_ = c.slices.AddIndexers(cache.Indexers{byService: func(obj any) ([]string, error) {
		if k, ok := sliceKey(obj); ok {
			return []string{k.String()}, nil
		}
		return nil, nil
	}})
	_, _ = c.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.notifySlice(obj) },
		UpdateFunc: func(o, n any) { c.notifySlice(o); c.notifySlice(n) },
		DeleteFunc: func(obj any) { c.notifySlice(obj) },
	})
	_, _ = c.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.notifyService(obj) },
		UpdateFunc: func(_, n any) { c.notifyService(n) },
		DeleteFunc: func(obj any) { c.notifyService(obj) },
	})
	return c
}

// SetHandler sets the function told of changes; call it before Start.
func (c *Cache) SetHandler(h func(Key)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handler = h
}

func (c *Cache) notify(k Key) {
	c.mu.RLock()
	h := c.handler
	c.mu.RUnlock()
	if h != nil {
		h(k)
	}
}

func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

func sliceKey(obj any) (Key, bool) {
	s, ok := unwrap(obj).(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[discoveryv1.LabelServiceName] == "" {
		return Key{}, false
	}
	return Key{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]}, true
}

func (c *Cache) notifySlice(obj any) {
	if k, ok := sliceKey(obj); ok {
		c.notify(k)
	}
}

func (c *Cache) notifyService(obj any) {
	if s, ok := unwrap(obj).(*corev1.Service); ok {
		c.notify(Key{Namespace: s.Namespace, Name: s.Name})
	}
}

// Start runs the informers until ctx is done.
func (c *Cache) Start(ctx context.Context) { c.factory.Start(ctx.Done()) }

// Wait returns once the informers' goroutines ended (after ctx of Start).
func (c *Cache) Wait() { c.factory.Shutdown() }

// WaitForSync blocks until both informers listed everything (true) or ctx
// is done (false).
func (c *Cache) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), c.slices.HasSynced, c.services.HasSynced)
}

// Slices returns the marked slices of Service namespace/name, sorted by name.
func (c *Cache) Slices(namespace, name string) []*discoveryv1.EndpointSlice {
	k := Key{Namespace: namespace, Name: name}
	objs, _ := c.slices.GetIndexer().ByIndex(byService, k.String())
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*discoveryv1.EndpointSlice))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Service returns the marked Service namespace/name, if cached.
func (c *Cache) Service(namespace, name string) (*corev1.Service, bool) {
	k := Key{Namespace: namespace, Name: name}
	o, ok, _ := c.services.GetIndexer().GetByKey(k.String())
	if !ok {
		return nil, false
	}
	return o.(*corev1.Service), true
}

// Keys lists every Service that is marked or has marked slices, sorted.
func (c *Cache) Keys() []Key {
	seen := map[Key]bool{}
	for _, o := range c.services.GetIndexer().List() {
		s := o.(*corev1.Service)
		seen[Key{Namespace: s.Namespace, Name: s.Name}] = true
	}
	for _, k := range c.slices.GetIndexer().ListIndexFuncValues(byService) {
		if ns, name, err := cache.SplitMetaNamespaceKey(k); err == nil {
			seen[Key{Namespace: ns, Name: name}] = true
		}
	}
	out := make([]Key, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
