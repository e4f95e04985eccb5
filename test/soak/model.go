package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/worker"
)

// servicePort is the one port of every soak Service (and its slices).
const servicePort = 8080

// ep is one endpoint of a modelled Service.
type ep struct {
	IP    string
	Ready bool
}

// svcModel is what the churner last wrote for one Service.
type svcModel struct {
	Name    string // Kubernetes name
	Exists  bool
	Sync    bool   // the service-sync annotation
	Rename  bool   // service-name annotation set to <name>-alt
	Rev     int    // service-meta-rev annotation (every instance's meta)
	Eps     []ep   // endpoints, in one slice
	Slice   string // the slice's current name
	sliceNo int
}

func (s *svcModel) consulName() string {
	if s.Rename {
		return s.Name + "-alt"
	}
	return s.Name
}

// live reports whether the Service has instances in the desired state.
func (s *svcModel) live() bool {
	if !s.Exists || !s.Sync {
		return false
	}
	for _, e := range s.Eps {
		if e.Ready {
			return true
		}
	}
	return false
}

// model is one cluster's Services as the churner wrote them. The churner is
// the only writer of the cluster's namespace; the checker never reads the
// model (it reads Kubernetes), the churner uses it to pick its next write
// and to count the changes it made to the desired Consul state.
type model struct {
	ns      string
	base    int // second octet of the cluster's endpoint IPs
	kube    kubernetes.Interface
	mu      sync.Mutex
	svcs    []*svcModel
	nextIP  int
	changes int // writes that changed the desired Consul state
	writes  int // Kubernetes writes made
	failed  int // Kubernetes writes that failed (the apiserver restarting, ...)
}

func newModel(kube kubernetes.Interface, ns string, base, n int, rng *rand.Rand) *model {
	m := &model{ns: ns, base: base, kube: kube}
	for i := range n {
		s := &svcModel{Name: fmt.Sprintf("svc-%03d", i), Exists: true, Sync: rng.IntN(10) > 0, Slice: fmt.Sprintf("svc-%03d-0", i)}
		for range 1 + rng.IntN(4) {
			s.Eps = append(s.Eps, ep{IP: m.newIP(), Ready: rng.IntN(8) > 0})
		}
		m.svcs = append(m.svcs, s)
	}
	return m
}

func (m *model) newIP() string {
	k := m.nextIP
	m.nextIP++
	return fmt.Sprintf("10.%d.%d.%d", m.base, (k/250)%250, k%250+1)
}

// create writes every Service and slice of the model.
func (m *model) create(ctx context.Context) error {
	if err := fixture.Namespace(ctx, m.kube, m.ns); err != nil {
		return err
	}
	for _, s := range m.svcs {
		if err := m.writeService(ctx, s); err != nil {
			return err
		}
		if err := m.writeSlice(ctx, s, s.Slice); err != nil {
			return err
		}
	}
	return nil
}

func (m *model) annotations(s *svcModel) map[string]string {
	a := map[string]string{worker.AnnotationSync: strconv.FormatBool(s.Sync)}
	if s.Rename {
		a[worker.AnnotationName] = s.consulName()
	}
	if s.Rev > 0 {
		a[worker.AnnotationMeta+"rev"] = strconv.Itoa(s.Rev)
	}
	return a
}

func (m *model) writeService(ctx context.Context, s *svcModel) error {
	return fixture.ApplyService(ctx, m.kube, fixture.Service(m.ns, s.Name, m.annotations(s), map[string]int32{"http": servicePort}))
}

func (m *model) writeSlice(ctx context.Context, s *svcModel, name string) error {
	eps := make([]fixture.EP, len(s.Eps))
	for i, e := range s.Eps {
		eps[i] = fixture.EP{IP: e.IP, NotReady: !e.Ready, Pod: s.Name + "-" + strconv.Itoa(i)}
	}
	return fixture.ApplySlice(ctx, m.kube, fixture.Slice(m.ns, s.Name, name, discoveryv1.AddressTypeIPv4, map[string]int32{"http": servicePort}, eps))
}

// op is one churn step: it mutates a copy of a Service and writes it.
type op struct {
	name   string
	weight int
	do     func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (changed bool, err error)
}

var churnOps = []op{
	{"scale-up", 20, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		s.Eps = append(s.Eps, ep{IP: m.newIP(), Ready: true})
		return s.Exists && s.Sync, m.writeSlice(ctx, s, s.Slice)
	}},
	{"scale-down", 15, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		if len(s.Eps) < 2 {
			return false, nil
		}
		i := rng.IntN(len(s.Eps))
		was := s.Eps[i].Ready
		s.Eps = slices.Delete(s.Eps, i, i+1)
		return s.Exists && s.Sync && was, m.writeSlice(ctx, s, s.Slice)
	}},
	{"rollout-step", 15, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		if len(s.Eps) == 0 {
			return false, nil
		}
		i := rng.IntN(len(s.Eps))
		s.Eps[i] = ep{IP: m.newIP(), Ready: true}
		return s.Exists && s.Sync, m.writeSlice(ctx, s, s.Slice)
	}},
	{"readiness-flip", 20, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		if len(s.Eps) == 0 {
			return false, nil
		}
		i := rng.IntN(len(s.Eps))
		s.Eps[i].Ready = !s.Eps[i].Ready
		return s.Exists && s.Sync, m.writeSlice(ctx, s, s.Slice)
	}},
	{"slice-recreate", 6, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		// As a controller replacing a slice: the new one first, then the
		// old one deleted. The desired state does not change.
		s.sliceNo++
		old, name := s.Slice, fmt.Sprintf("%s-%d", s.Name, s.sliceNo)
		if err := m.writeSlice(ctx, s, name); err != nil {
			return false, err
		}
		s.Slice = name
		err := m.kube.DiscoveryV1().EndpointSlices(m.ns).Delete(ctx, old, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			err = nil
		}
		return false, err
	}},
	{"sync-toggle", 5, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		before := s.live()
		s.Sync = !s.Sync
		return before != s.live(), m.writeService(ctx, s)
	}},
	{"rename", 5, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		s.Rename = !s.Rename
		return s.live(), m.writeService(ctx, s)
	}},
	{"delete", 3, func(ctx context.Context, m *model, s *svcModel, rng *rand.Rand) (bool, error) {
		before := s.live()
		err := m.kube.CoreV1().Services(m.ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
		if err == nil || apierrors.IsNotFound(err) {
			s.Exists = false
			err = m.kube.DiscoveryV1().EndpointSlices(m.ns).Delete(ctx, s.Slice, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				err = nil
			}
		}
		return before, err
	}},
}

// recreate brings a deleted Service back (weight of its own: only deleted
// Services can be picked).
func (m *model) recreate(ctx context.Context, s *svcModel) (bool, error) {
	s.Exists = true
	s.sliceNo++
	s.Slice = fmt.Sprintf("%s-%d", s.Name, s.sliceNo)
	if err := m.writeService(ctx, s); err != nil {
		return false, err
	}
	return s.live(), m.writeSlice(ctx, s, s.Slice)
}

// step makes one random change. Only a write that succeeded updates the
// model; a failed one is retried by later steps (ApplySlice writes the
// model's whole slice).
func (m *model) step(ctx context.Context, rng *rand.Rand) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.svcs[rng.IntN(len(m.svcs))]
	cp := *s
	cp.Eps = slices.Clone(s.Eps)
	var (
		name    string
		changed bool
		err     error
	)
	if !s.Exists {
		name = "create"
		changed, err = m.recreate(ctx, &cp)
	} else {
		o := pickOp(rng)
		name = o.name
		changed, err = o.do(ctx, m, &cp, rng)
	}
	m.writes++
	if err != nil {
		m.failed++
		return name, err
	}
	*s = cp
	if changed {
		m.changes++
	}
	return name, nil
}

// touch changes the meta of every instance of Service name, so that its
// worker must update each of them, the tampered one included (the tamper
// fault uses it). It is a counted change.
func (m *model) touch(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.svcs {
		if s.Name != name || !s.Exists {
			continue
		}
		cp := *s
		cp.Rev++
		m.writes++
		if err := m.writeService(ctx, &cp); err != nil {
			m.failed++
			return err
		}
		*s = cp
		if cp.live() {
			m.changes++
		}
		return nil
	}
	return fmt.Errorf("no Service %s/%s", m.ns, name)
}

func (m *model) counts() (changes, writes, failed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changes, m.writes, m.failed
}

func pickOp(rng *rand.Rand) op {
	total := 0
	for _, o := range churnOps {
		total += o.weight
	}
	n := rng.IntN(total)
	for _, o := range churnOps {
		if n < o.weight {
			return o
		}
		n -= o.weight
	}
	return churnOps[0]
}
