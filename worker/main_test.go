package worker

import (
	"maps"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Shared fixtures: cluster "east", Service shop/web with port "http".

const (
	testNS   = "shop"
	testName = "web"
)

var testKey = k8s.Key{Namespace: testNS, Name: testName}

func testCluster(t testing.TB) ownership.Cluster {
	t.Helper()
	c, err := ownership.New("east")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testConfig(t testing.TB) Config {
	return Config{
		Cluster:       testCluster(t),
		DefaultWindow: time.Second,
		K8sTag:        "k8s",
		Terminating:   TerminatingWarning,
	}
}

// svcOpt edits a test Service.
type svcOpt func(*k8s.Service)

// newSvc returns shop/web with ports http:80 and metrics:9090 and the given
// endpoints; annotations are added with withAnn.
func newSvc(eps []k8s.Endpoint, opts ...svcOpt) *k8s.Service {
	s := &k8s.Service{
		Key:         testKey,
		UID:         "uid-web",
		Type:        corev1.ServiceTypeClusterIP,
		Annotations: map[string]string{AnnotationSync: "true"},
		Ports: []k8s.Port{
			{Name: "http", Port: 80, Protocol: "TCP"},
			{Name: "metrics", Port: 9090, Protocol: "TCP"},
		},
		Endpoints: eps,
		Object: &corev1.Service{ObjectMeta: metav1.ObjectMeta{
			Namespace: testNS, Name: testName, UID: "uid-web",
		}},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withAnn(kv ...string) svcOpt {
	return func(s *k8s.Service) {
		for i := 0; i+1 < len(kv); i += 2 {
			s.Annotations[kv[i]] = kv[i+1]
		}
	}
}

// ready returns a ready endpoint on pod p with ports http:8080, metrics:9100.
func ready(addr, pod string) k8s.Endpoint {
	return k8s.Endpoint{
		Address: addr,
		Ports:   map[string]int32{"http": 8080, "metrics": 9100},
		Ready:   true, Serving: true,
		Pod: pod, Node: "node-" + pod, Zone: "zone-a",
	}
}

// cloneSvc deep-copies what Desired reads, so a test can edit its Service
// while a worker reads a copy.
func cloneSvc(s *k8s.Service) *k8s.Service {
	if s == nil {
		return nil
	}
	c := *s
	c.Annotations = maps.Clone(s.Annotations)
	c.Ports = slices.Clone(s.Ports)
	c.Problems = slices.Clone(s.Problems)
	c.Endpoints = slices.Clone(s.Endpoints)
	c.ExternalIPs = slices.Clone(s.ExternalIPs)
	c.LoadBalancer = slices.Clone(s.LoadBalancer)
	c.Nodes = maps.Clone(s.Nodes)
	c.Ingresses = slices.Clone(s.Ingresses)
	for i := range c.Endpoints {
		c.Endpoints[i].Ports = maps.Clone(c.Endpoints[i].Ports)
	}
	return &c
}

func cloneInstance(in consul.Instance) consul.Instance {
	in.Tags = slices.Clone(in.Tags)
	in.Meta = maps.Clone(in.Meta)
	return in
}

func cloneChange(ch consul.Change) consul.Change {
	var out consul.Change
	for _, r := range ch.Register {
		out.Register = append(out.Register, cloneInstance(r))
	}
	for _, u := range ch.Update {
		u.Want = cloneInstance(u.Want)
		u.Have.Instance = cloneInstance(u.Have.Instance)
		out.Update = append(out.Update, u)
	}
	for _, r := range ch.Deregister {
		r.Instance = cloneInstance(r.Instance)
		out.Deregister = append(out.Deregister, r)
	}
	return out
}
