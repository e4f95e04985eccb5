package apply

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Owner decides whether an object is ours (k8smark.Mark).
type Owner interface {
	Owns(obj metav1.Object) error
}

// DefaultFieldManager is the field manager of fleetsync's writes.
const DefaultFieldManager = "fleetsync-to-k8s"

// Options configure a Writer.
type Options struct {
	// QPS and Burst are the client-side budget of writes (QPS <= 0:
	// unlimited).
	QPS   float64
	Burst int
	// FieldManager names fleetsync in managedFields (default
	// DefaultFieldManager).
	FieldManager string
	// Observe, when set, is told every request sent: verb (create,
	// update, apply, delete), kind (EndpointSlice, Service) and its error.
	Observe func(verb, kind string, err error)
}

// ErrNotOurs is returned, wrapped, for an object the owner refuses.
var ErrNotOurs = errors.New("not ours")

// Writer writes marked objects. It is safe for concurrent use.
type Writer struct {
	client  kubernetes.Interface
	owner   Owner
	limiter *rate.Limiter
	manager string
	observe func(verb, kind string, err error)
}

// New returns a writer for owner; owner is required.
func New(client kubernetes.Interface, owner Owner, opts Options) (*Writer, error) {
	if client == nil || owner == nil {
		return nil, errors.New("apply: a client and an owner are required")
	}
	lim := rate.NewLimiter(rate.Inf, 1)
	if opts.QPS > 0 {
		lim = rate.NewLimiter(rate.Limit(opts.QPS), max(opts.Burst, 1))
	}
	if opts.FieldManager == "" {
		opts.FieldManager = DefaultFieldManager
	}
	if opts.Observe == nil {
		opts.Observe = func(string, string, error) {}
	}
	return &Writer{client: client, owner: owner, limiter: lim, manager: opts.FieldManager, observe: opts.Observe}, nil
}

func (w *Writer) owns(verb string, objs ...metav1.Object) error {
	for _, o := range objs {
		if err := w.owner.Owns(o); err != nil {
			return fmt.Errorf("refusing to %s %s/%s: %w: %w", verb, o.GetNamespace(), o.GetName(), ErrNotOurs, err)
		}
	}
	return nil
}

// prepaidKey is the context key of a Prepay's tokens.
type prepaidKey struct{}

// prepaid is the tokens one Prepay took from w's budget.
type prepaid struct {
	w    *Writer
	left atomic.Int64
}

// take spends one prepaid write, if one is left.
func (p *prepaid) take() bool {
	for {
		n := p.left.Load()
		if n <= 0 {
			return false
		}
		if p.left.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// Prepay takes min(n, burst) writes from the budget at once, waiting as
// one write would for that many, and returns a ctx whose writes through w
// spend them before waiting again: a flush that prepays its writes sends
// them back to back instead of each queueing behind every other flush's.
// Tokens never spent are not given back (the budget only ever counts more
// writes than were sent, never fewer), so the QPS/burst contract holds.
// A ctx that already carries w's prepaid writes gets n more (returned as
// it is). n <= 0 or an unlimited budget returns ctx as it is.
func (w *Writer) Prepay(ctx context.Context, n int) (context.Context, error) {
	if n <= 0 || w.limiter.Limit() == rate.Inf {
		return ctx, nil
	}
	n = min(n, w.limiter.Burst())
	if err := w.limiter.WaitN(ctx, n); err != nil {
		return ctx, fmt.Errorf("prepay %d writes: write budget: %w", n, err)
	}
	if p, ok := ctx.Value(prepaidKey{}).(*prepaid); ok && p.w == w {
		p.left.Add(int64(n))
		return ctx, nil
	}
	p := &prepaid{w: w}
	p.left.Store(int64(n))
	return context.WithValue(ctx, prepaidKey{}, p), nil
}

// send waits for the budget (or spends a token ctx prepaid), then runs one
// request and reports it.
func (w *Writer) send(ctx context.Context, verb, kind string, f func() error) error {
	if p, ok := ctx.Value(prepaidKey{}).(*prepaid); !ok || p.w != w || !p.take() {
		if err := w.limiter.Wait(ctx); err != nil {
			return fmt.Errorf("%s %s: write budget: %w", verb, kind, err)
		}
	}
	err := f()
	w.observe(verb, kind, err)
	return err
}

// CreateSlice creates s, which must carry the mark.
func (w *Writer) CreateSlice(ctx context.Context, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	if err := w.owns("create", s); err != nil {
		return nil, err
	}
	s = s.DeepCopy()
	s.ResourceVersion, s.UID = "", ""
	var out *discoveryv1.EndpointSlice
	err := w.send(ctx, "create", "EndpointSlice", func() (err error) {
		out, err = w.client.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: w.manager})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create endpointslice %s/%s: %w", s.Namespace, s.Name, err)
	}
	return out, nil
}

// UpdateSlice replaces old, as read with the mark, by s (marked too) on
// the condition that old's resourceVersion is still the stored one.
func (w *Writer) UpdateSlice(ctx context.Context, old, s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	if err := w.owns("update", old, s); err != nil {
		return nil, err
	}
	if old.ResourceVersion == "" || old.Namespace != s.Namespace || old.Name != s.Name {
		return nil, fmt.Errorf("update endpointslice %s/%s: the object read has no resourceVersion or another name", s.Namespace, s.Name)
	}
	s = s.DeepCopy()
	s.ResourceVersion, s.UID = old.ResourceVersion, old.UID
	var out *discoveryv1.EndpointSlice
	err := w.send(ctx, "update", "EndpointSlice", func() (err error) {
		out, err = w.client.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{FieldManager: w.manager})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update endpointslice %s/%s: %w", s.Namespace, s.Name, err)
	}
	return out, nil
}

// DeleteSlice deletes old, as read with the mark, on the condition that
// its UID and resourceVersion are still the stored ones.
func (w *Writer) DeleteSlice(ctx context.Context, old *discoveryv1.EndpointSlice) error {
	if err := w.owns("delete", old); err != nil {
		return err
	}
	err := w.send(ctx, "delete", "EndpointSlice", func() error {
		return w.client.DiscoveryV1().EndpointSlices(old.Namespace).Delete(ctx, old.Name, preconditions(old))
	})
	if err != nil {
		return fmt.Errorf("delete endpointslice %s/%s: %w", old.Namespace, old.Name, err)
	}
	return nil
}

func preconditions(old metav1.Object) metav1.DeleteOptions {
	uid, rv := old.GetUID(), old.GetResourceVersion()
	return metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}
}

// CreateService creates svc, which must carry the mark. A Service of that
// name that exists is left alone (AlreadyExists).
func (w *Writer) CreateService(ctx context.Context, svc *corev1.Service) (*corev1.Service, error) {
	if err := w.owns("create", svc); err != nil {
		return nil, err
	}
	svc = svc.DeepCopy()
	svc.ResourceVersion, svc.UID = "", ""
	var out *corev1.Service
	err := w.send(ctx, "create", "Service", func() (err error) {
		out, err = w.client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: w.manager})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// UpdateService replaces old, as read with the mark, by old with svc's
// labels, annotations, type, ports and externalName, on the condition that old's
// resourceVersion is still the stored one: every label, annotation and
// field others set on old is kept. (Not a server-side apply: a port that
// fleetsync created by a create stays owned by that create's entry in
// managedFields, so an apply could not drop it when the port changes.)
func (w *Writer) UpdateService(ctx context.Context, old, svc *corev1.Service) (*corev1.Service, error) {
	if err := w.owns("update", old, svc); err != nil {
		return nil, err
	}
	if old.ResourceVersion == "" || old.Namespace != svc.Namespace || old.Name != svc.Name {
		return nil, fmt.Errorf("update service %s/%s: the object read has no resourceVersion or another name", svc.Namespace, svc.Name)
	}
	next := old.DeepCopy()
	next.Labels, next.Annotations = merged(old.Labels, svc.Labels), merged(old.Annotations, svc.Annotations)
	next.Spec.Type, next.Spec.Ports, next.Spec.ExternalName = svc.Spec.Type, svc.Spec.Ports, svc.Spec.ExternalName
	var out *corev1.Service
	err := w.send(ctx, "update", "Service", func() (err error) {
		out, err = w.client.CoreV1().Services(svc.Namespace).Update(ctx, next, metav1.UpdateOptions{FieldManager: w.manager})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// AdoptService makes the Service of svc's name, which does not carry the
// mark, fleetsync's: it reads it, lets adopt refuse it or return what it
// becomes (which must carry the mark), and writes that on the condition
// that the resourceVersion read is still the stored one.
func (w *Writer) AdoptService(ctx context.Context, svc *corev1.Service, adopt func(old *corev1.Service) (*corev1.Service, error)) (*corev1.Service, error) {
	old, err := w.client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("adopt service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	next, err := adopt(old.DeepCopy())
	if err != nil {
		return nil, fmt.Errorf("adopt service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	if err := w.owns("adopt", next); err != nil {
		return nil, err
	}
	if next.Namespace != old.Namespace || next.Name != old.Name || next.UID != old.UID {
		return nil, fmt.Errorf("adopt service %s/%s: the adopted object has another name or UID", svc.Namespace, svc.Name)
	}
	next.ResourceVersion = old.ResourceVersion
	var out *corev1.Service
	err = w.send(ctx, "update", "Service", func() (err error) {
		out, err = w.client.CoreV1().Services(next.Namespace).Update(ctx, next, metav1.UpdateOptions{FieldManager: w.manager})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("adopt service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// merged is a copy of base with over's keys set.
func merged(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// DeleteService deletes old, as read with the mark, on the condition that
// its UID and resourceVersion are still the stored ones.
func (w *Writer) DeleteService(ctx context.Context, old *corev1.Service) error {
	if err := w.owns("delete", old); err != nil {
		return err
	}
	err := w.send(ctx, "delete", "Service", func() error {
		return w.client.CoreV1().Services(old.Namespace).Delete(ctx, old.Name, preconditions(old))
	})
	if err != nil {
		return fmt.Errorf("delete service %s/%s: %w", old.Namespace, old.Name, err)
	}
	return nil
}
