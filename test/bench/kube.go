package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/worker"
)

var httpPorts = map[string]int32{"http": 80}

// writers is how many goroutines create objects in the API server at once.
const writers = 8

// benchService is a headless selectorless Service opted in to sync: headless
// because the test API server's ClusterIP range holds only 254 addresses.
func benchService(ns, name string, extra map[string]string) *corev1.Service {
	ann := map[string]string{worker.AnnotationSync: "true"}
	for k, v := range extra {
		ann[k] = v
	}
	svc := fixture.Service(ns, name, ann, httpPorts)
	svc.Spec.ClusterIP = corev1.ClusterIPNone
	return svc
}

func svcName(i int) string { return fmt.Sprintf("%s%05d", svcPrefix, i) }

// ipBase spreads Services over 10.1.x.x .. 10.250.x.x (fixture.IPs); two
// Services may share addresses, as they would not in a cluster, but
// instances are per Service anyway.
func ipBase(i int) int { return i%250 + 1 }

// sliceState is one EndpointSlice as last written, and the fixture.IPs offset
// its endpoints start at.
type sliceState struct {
	obj    *discoveryv1.EndpointSlice
	base   int
	offset int
	n      int
}

// endpoints are the slice's current endpoints (base, offset, n).
func (s *sliceState) endpoints() []fixture.EP { return fixture.IPs(s.base, s.offset, s.n) }

// populate makes benchNS hold Services [b.populated, n), each with one
// EndpointSlice of e ready endpoints.
func (b *bench) populate(n, e int) error {
	if b.populated >= n {
		return nil
	}
	if b.slices == nil {
		b.slices = map[string]*sliceState{}
	}
	if err := fixture.Namespace(b.ctx, b.kc, benchNS); err != nil {
		return err
	}
	from := b.populated
	start := time.Now()
	var mu sync.Mutex
	err := parallel(b.ctx, from, n, func(ctx context.Context, i int) error {
		name := svcName(i)
		st, err := createService(ctx, b.kc, benchService(benchNS, name, nil), ipBase(i), 0, e)
		if err != nil {
			return err
		}
		mu.Lock()
		b.slices[name] = st
		mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	b.populated = n
	d := time.Since(start)
	b.logf("created %d Services + %d EndpointSlices (%d endpoints each) in the API server in %s (%.0f objects/s)",
		n-from, n-from, e, d.Round(time.Millisecond), float64(2*(n-from))/d.Seconds())
	return nil
}

// createService creates svc and one slice "<name>-1" with n endpoints from
// fixture.IPs(base, offset, n).
func createService(ctx context.Context, c kubernetes.Interface, svc *corev1.Service, base, offset, n int) (*sliceState, error) {
	if _, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	st := &sliceState{base: base, offset: offset, n: n}
	s := fixture.Slice(svc.Namespace, svc.Name, svc.Name+"-1", discoveryv1.AddressTypeIPv4, httpPorts, st.endpoints())
	obj, err := c.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		obj, err = c.DiscoveryV1().EndpointSlices(svc.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if err == nil {
			st.obj = obj
			return st, setEndpoints(ctx, c, st, st.endpoints())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create endpointslice %s/%s: %w", s.Namespace, s.Name, err)
	}
	st.obj = obj
	return st, nil
}

// setEndpoints replaces the endpoints of the slice in st (one Update, using
// the resourceVersion last seen; on a conflict it reads the slice and tries
// again once). One goroutine at a time may use st.
func setEndpoints(ctx context.Context, c kubernetes.Interface, st *sliceState, eps []fixture.EP) error {
	cur := st.obj
	s := fixture.Slice(cur.Namespace, cur.Labels[discoveryv1.LabelServiceName], cur.Name, cur.AddressType, httpPorts, eps)
	api := c.DiscoveryV1().EndpointSlices(cur.Namespace)
	for attempt := 0; ; attempt++ {
		s.ResourceVersion = cur.ResourceVersion
		out, err := api.Update(ctx, s, metav1.UpdateOptions{})
		if err == nil {
			st.obj = out
			return nil
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			return fmt.Errorf("update endpointslice %s/%s: %w", s.Namespace, s.Name, err)
		}
		if cur, err = api.Get(ctx, s.Name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
}

// deleteService deletes a Service and every slice labelled for it.
func deleteService(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	err := c.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return c.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
}

// parallel runs fn for every i in [from, to) on `writers` goroutines and
// returns the first error (the others stop early).
func parallel(ctx context.Context, from, to int, fn func(ctx context.Context, i int) error) error {
	return parallelN(ctx, writers, from, to, fn)
}

// parallelN is parallel on k goroutines.
func parallelN(ctx context.Context, k, from, to int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	next.Store(int64(from))
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range k {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
