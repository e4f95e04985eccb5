package k8s

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

var (
	v4 = discoveryv1.AddressTypeIPv4
	v6 = discoveryv1.AddressTypeIPv6
)

func newTestService(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       ns,
			Name:            name,
			UID:             types.UID("uid-" + name),
			ResourceVersion: "1",
			Annotations:     map[string]string{"consul.hashicorp.com/service-sync": "true"},
		},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: ports},
	}
}

func newTestSlice(ns, name, service string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"},
		AddressType: family,
		Ports:       ports,
		Endpoints:   eps,
	}
	if service != "" {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: service}
	}
	return s
}

func namedPort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}
}

func ports(p ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return p }

// endpoint is a slice endpoint with nil conditions, on a pod, node and zone.
func endpoint(pod string, addresses ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses: addresses,
		TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: pod},
		NodeName:  ptr.To("node-" + pod),
		Zone:      ptr.To("zone-a"),
	}
}

func withConditions(ep discoveryv1.Endpoint, ready, serving, terminating *bool) discoveryv1.Endpoint {
	ep.Conditions = discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
	return ep
}

// changes is a Handler that forwards keys to a channel until done closes.
type changes struct {
	ch   chan Key
	done <-chan struct{}
}

func (c *changes) Changed(key Key) {
	select {
	case c.ch <- key:
	case <-c.done:
	}
}

// next returns the next notification, failing the test if none comes.
func (c *changes) next(t *testing.T) Key {
	t.Helper()
	select {
	case key := <-c.ch:
		return key
	case <-time.After(wait.ForeverTestTimeout):
		t.Fatal("no Changed notification")
		return Key{}
	}
}

// expect asserts the next notifications, in order.
func (c *changes) expect(t *testing.T, want ...Key) {
	t.Helper()
	for _, w := range want {
		if got := c.next(t); got != w {
			t.Fatalf("Changed(%v), want Changed(%v)", got, w)
		}
	}
}

// startWatcher starts a Watcher on client, waits for its sync and stops
// it when the test ends.
func startWatcher(t testing.TB, client kubernetes.Interface, resync time.Duration) (*Watcher, *changes) {
	t.Helper()
	return startWatcherWith(t, client, WatcherOptions{Resync: resync, Nodes: true})
}

// startWatcherWith is startWatcher with every option.
func startWatcherWith(t testing.TB, client kubernetes.Interface, opts WatcherOptions) (*Watcher, *changes) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := NewWatcherWith(client, opts)
	c := &changes{ch: make(chan Key, 1000), done: ctx.Done()}
	w.SetHandler(c)
	w.Start(ctx)
	t.Cleanup(func() {
		cancel()
		w.Wait()
	})
	syncCtx, syncCancel := context.WithTimeout(ctx, wait.ForeverTestTimeout)
	defer syncCancel()
	if !w.WaitForSync(syncCtx) {
		t.Fatal("watcher did not sync")
	}
	if !w.HasSynced() {
		t.Fatal("HasSynced false after WaitForSync")
	}
	return w, c
}
