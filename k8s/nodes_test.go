package k8s

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func testNode(name, rv string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv, Labels: map[string]string{"big": "label"}},
		Status: corev1.NodeStatus{
			Addresses:  addrs,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Images:     []corev1.ContainerImage{{Names: []string{"registry.example/huge:1"}, SizeBytes: 1 << 30}},
		},
	}
}

func nodePortService(ns, name string) *corev1.Service {
	s := newTestService(ns, name)
	s.Spec.Type = corev1.ServiceTypeNodePort
	return s
}

// TestNodeAddressChangeNotifiesItsNodePortServices: a node whose addresses
// change notifies exactly the NodePort Services with endpoints on it; a
// node update that leaves the addresses alone (a heartbeat) notifies
// nothing; the cache holds the addresses only.
func TestNodeAddressChangeNotifiesItsNodePortServices(t *testing.T) {
	ctx := context.Background()
	ip := func(a string) corev1.NodeAddress { return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a} }
	onNode := func(pod, node, addr string) discoveryv1.Endpoint {
		ep := endpoint(pod, addr)
		ep.NodeName = ptr.To(node)
		return ep
	}
	client := fake.NewClientset(
		testNode("n1", "1", ip("192.0.2.1")), testNode("n2", "1", ip("192.0.2.2")), testNode("n3", "1", ip("192.0.2.3")),
		nodePortService("shop", "np3"), newTestSlice("shop", "np3-a", "np3", v4, nil, onNode("e", "n3", "10.0.0.5")),
		nodePortService("shop", "np1"), nodePortService("shop", "np2"), newTestService("shop", "cip"),
		newTestSlice("shop", "np1-a", "np1", v4, nil, onNode("a", "n1", "10.0.0.1"), onNode("b", "n2", "10.0.0.2")),
		newTestSlice("shop", "np2-a", "np2", v4, nil, onNode("c", "n2", "10.0.0.3")),
		newTestSlice("shop", "cip-a", "cip", v4, nil, onNode("d", "n1", "10.0.0.4")),
	)
	w, c := startWatcher(t, client, 0)
	drain(c)
	np1 := Key{Namespace: "shop", Name: "np1"}
	// mark changes n3's address and expects np3 next: the Node informer
	// delivers in order, so anything notified before it shows up first.
	rv := 1
	mark := func() {
		t.Helper()
		rv++
		if _, err := client.CoreV1().Nodes().Update(ctx, testNode("n3", "r"+string(rune('0'+rv)), ip("192.0.3."+string(rune('0'+rv)))), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.expect(t, Key{Namespace: "shop", Name: "np3"})
	}

	if _, err := client.CoreV1().Nodes().Update(ctx, testNode("n1", "2", ip("192.0.2.11")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, np1) // not cip (ClusterIP, on n1 too), not np2 (on n2)
	mark()
	svc, ok, err := w.Service(np1)
	if err != nil || !ok {
		t.Fatalf("Service(np1): %v %v", ok, err)
	}
	want := map[string][]NodeAddress{
		"n1": {{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}},
		"n2": {{Type: corev1.NodeInternalIP, Address: "192.0.2.2"}},
	}
	if !reflect.DeepEqual(svc.Nodes, want) {
		t.Errorf("np1 Nodes = %v, want %v", svc.Nodes, want)
	}

	// A heartbeat: new resourceVersion, same addresses.
	if _, err := client.CoreV1().Nodes().Update(ctx, testNode("n1", "3", ip("192.0.2.11")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mark() // np3 is the next notification: the heartbeat made none

	obj, ok, err := w.nodes.GetIndexer().GetByKey("n2")
	if err != nil || !ok {
		t.Fatalf("n2 not cached: %v", err)
	}
	n := obj.(*corev1.Node)
	if len(n.Labels) != 0 || len(n.Status.Conditions) != 0 || len(n.Status.Images) != 0 || len(n.Status.Addresses) != 1 {
		t.Errorf("cached node keeps more than its addresses: %+v", n)
	}

	if err := client.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, np1, Key{Namespace: "shop", Name: "np2"})
}

// TestIngressNotifiesItsBackends: an Ingress notifies the Services its "/"
// rules send to, before and after a change, and the view carries the
// routes.
func TestIngressNotifiesItsBackends(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(newTestService("shop", "web"), newTestService("shop", "api"))
	w, c := startWatcherWith(t, client, WatcherOptions{Nodes: true, Ingresses: true})
	drain(c)
	rule := func(host, path, svc string) networkingv1.IngressRule {
		return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
			Paths: []networkingv1.HTTPIngressPath{{Path: path, Backend: networkingv1.IngressBackend{
				Service: &networkingv1.IngressServiceBackend{Name: svc}}}},
		}}}
	}
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "front", ResourceVersion: "1"},
		Spec: networkingv1.IngressSpec{
			Rules: []networkingv1.IngressRule{rule("web.example.com", "/", "web"), rule("api.example.com", "/v1", "api"), {Host: "nohttp.example.com"}},
			TLS:   []networkingv1.IngressTLS{{Hosts: []string{"web.example.com"}}},
		},
		Status: networkingv1.IngressStatus{LoadBalancer: networkingv1.IngressLoadBalancerStatus{
			Ingress: []networkingv1.IngressLoadBalancerIngress{{IP: "203.0.113.1"}}}},
	}
	if _, err := client.NetworkingV1().Ingresses("shop").Create(ctx, ing, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, web) // not api: its rule has no "/" path
	svc, _, err := w.Service(web)
	if err != nil {
		t.Fatal(err)
	}
	want := []IngressRoute{{Ingress: "shop/front", Rule: 0, Host: "web.example.com", TLS: true, LoadBalancerIP: "203.0.113.1"}}
	if !reflect.DeepEqual(svc.Ingresses, want) {
		t.Errorf("web Ingresses = %+v, want %+v", svc.Ingresses, want)
	}
	ing.Spec.Rules[0] = rule("web.example.com", "/", "api")
	ing.ResourceVersion = "2"
	if _, err := client.NetworkingV1().Ingresses("shop").Update(ctx, ing, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, web, api)
	if svc, _, _ := w.Service(web); len(svc.Ingresses) != 0 {
		t.Errorf("web still routed after the rule moved: %+v", svc.Ingresses)
	}
}

// drain empties the notifications of the initial list.
func drain(c *changes) {
	for {
		select {
		case <-c.ch:
		default:
			return
		}
	}
}
