package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// sliceWatch is an informer on the EndpointSlices of one namespace: the
// view a kube-proxy has of what fleetsync mirrored. It counts every event
// per Service (each one is a write that reached the API server and changed
// the object) and wakes waiters on each.
type sliceWatch struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every event
	slices  map[string]*discoveryv1.EndpointSlice
	events  map[string]int // by kubernetes.io/service-name
	total   int
	stop    context.CancelFunc
}

func startSliceWatch(ctx context.Context, kc kubernetes.Interface, ns string) (*sliceWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &sliceWatch{changed: make(chan struct{}), slices: map[string]*discoveryv1.EndpointSlice{}, events: map[string]int{}, stop: cancel}
	f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(ns))
	inf := f.Discovery().V1().EndpointSlices().Informer()
	on := func(obj any, deleted bool) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if deleted {
			delete(w.slices, s.Name)
		} else {
			w.slices[s.Name] = s
		}
		w.events[s.Labels[discoveryv1.LabelServiceName]]++
		w.total++
		close(w.changed)
		w.changed = make(chan struct{})
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { on(o, false) },
		UpdateFunc: func(_, o any) { on(o, false) },
		DeleteFunc: func(o any) { on(o, true) },
	}); err != nil {
		cancel()
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cancel()
		return nil, fmt.Errorf("EndpointSlice informer on %s did not sync", ns)
	}
	return w, nil
}

// counts returns the events so far, in all and for one Service.
func (w *sliceWatch) counts(svc string) (total, of int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.total, w.events[svc]
}

// until waits until cond holds on the slices (by name), re-checking on
// every event.
func (w *sliceWatch) until(ctx context.Context, cond func(map[string]*discoveryv1.EndpointSlice) bool) error {
	for {
		w.mu.Lock()
		ok, ch := cond(w.slices), w.changed
		w.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// endpointsOf is every address of a Service's slices with its ready
// condition.
func endpointsOf(slices map[string]*discoveryv1.EndpointSlice, svc string) (n int, ready map[string]bool, objects int) {
	ready = map[string]bool{}
	for _, s := range slices {
		if s.Labels[discoveryv1.LabelServiceName] != svc {
			continue
		}
		objects++
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				ready[a] = e.Conditions.Ready == nil || *e.Conditions.Ready
				n++
			}
		}
	}
	return n, ready, objects
}

// kubeWrites reads the API server's own count of writes (POST, PUT,
// PATCH, APPLY, DELETE) of Services, EndpointSlices and Events, from its
// /metrics (apiserver_request_total). A write that changed nothing is
// counted too, which an informer does not see.
func (b *bench) kubeWrites() (float64, error) {
	raw, err := b.kc.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(b.ctx)
	if err != nil {
		return 0, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	return parseKubeWrites(raw), nil
}

func parseKubeWrites(raw []byte) float64 {
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		switch labelValue(line, "resource") {
		case "services", "endpointslices", "events":
		default:
			continue
		}
		switch labelValue(line, "verb") {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE":
		default:
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}
