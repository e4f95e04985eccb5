package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// typesEnv is a namespace with Nodes of its own (Nodes are cluster-wide, so
// their names carry the namespace) and helpers to shape Services.
type typesEnv struct {
	*env
}

func newTypesEnv(t *testing.T) *typesEnv { return &typesEnv{newEnv(t)} }

func (e *typesEnv) nodeName(n string) string { return e.ns + "-" + n }

// node creates (or updates) Node n with status.addresses set through the
// status subresource, and deletes it at cleanup.
func (e *typesEnv) node(n string, addrs ...corev1.NodeAddress) {
	e.t.Helper()
	api := kube.Client.CoreV1().Nodes()
	name := e.nodeName(n)
	cur, err := api.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		cur, err = api.Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		must(e.t, err)
		e.t.Cleanup(func() { _ = api.Delete(e.env.ctx, name, metav1.DeleteOptions{}) })
	}
	cur.Status.Addresses = addrs
	_, err = api.UpdateStatus(e.ctx, cur, metav1.UpdateOptions{})
	must(e.t, err)
}

func internalIP(a string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a}
}
func externalIP(a string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: a}
}

// service creates Service name of type typ with port http:80, opted in,
// with extra annotations, and one EndpointSlice with eps.
func (e *typesEnv) service(name string, typ corev1.ServiceType, ann map[string]string, eps ...fixture.EP) {
	e.t.Helper()
	ports := map[string]int32{"http": 80}
	a := map[string]string{optIn: "true"}
	for k, v := range ann {
		a[k] = v
	}
	svc := fixture.Service(e.ns, name, a, ports)
	svc.Spec.Type = typ
	svc.Spec.Ports[0].TargetPort.IntVal = 8080
	must(e.t, fixture.ApplyService(e.ctx, kube.Client, svc))
	for i := range eps {
		if eps[i].Node != "" {
			eps[i].Node = e.nodeName(eps[i].Node)
		}
	}
	must(e.t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-1", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8080}, eps)))
}

// edit changes Service name with f (a spec change) and returns its NodePort.
func (e *typesEnv) edit(name string, f func(*corev1.Service)) int {
	e.t.Helper()
	api := kube.Client.CoreV1().Services(e.ns)
	cur, err := api.Get(e.ctx, name, metav1.GetOptions{})
	must(e.t, err)
	f(cur)
	cur, err = api.Update(e.ctx, cur, metav1.UpdateOptions{})
	must(e.t, err)
	return int(cur.Spec.Ports[0].NodePort)
}

// setLB sets status.loadBalancer.ingress of Service name through the
// status subresource.
func (e *typesEnv) setLB(name string, ingress ...corev1.LoadBalancerIngress) error {
	api := kube.Client.CoreV1().Services(e.ns)
	cur, err := api.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cur.Status.LoadBalancer.Ingress = ingress
	_, err = api.UpdateStatus(e.ctx, cur, metav1.UpdateOptions{})
	return err
}

func (e *typesEnv) nodePort(name string) int {
	e.t.Helper()
	svc, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	must(e.t, err)
	return int(svc.Spec.Ports[0].NodePort)
}

// oneTxn runs change, waits for Service name to hold want, and checks that
// it took exactly one catalog transaction, none after it within twice the
// window (a measurement interval, not synchronisation).
func (e *typesEnv) oneTxn(what, name, want string, change func()) {
	e.t.Helper()
	before := catalogTxns(e.t)
	change()
	e.waitInstances(name, want)
	time.Sleep(2 * time.Second)
	if n := catalogTxns(e.t) - before; n != 1 {
		e.t.Errorf("%s: %v catalog transactions, want 1", what, n)
	} else {
		e.t.Logf("%s: 1 catalog transaction", what)
	}
}

// idle checks that nothing is written for d.
func (e *typesEnv) idle(d time.Duration) {
	e.t.Helper()
	before := catalogTxns(e.t)
	time.Sleep(d) // a measurement interval, not synchronisation
	if n := catalogTxns(e.t) - before; n != 0 {
		e.t.Errorf("idle %s: %v catalog transactions, want 0", d, n)
	}
}

// waitEvent waits for a Warning Event with reason on Service name whose
// message contains every one of subs.
func (e *typesEnv) waitEvent(name, reason string, subs ...string) {
	e.t.Helper()
	eventually(e.t, 15*time.Second, reason+" event on Service "+name, func() error {
		list, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
	next:
		for _, x := range list.Items {
			if x.Type != corev1.EventTypeWarning || x.Reason != reason {
				continue
			}
			for _, s := range subs {
				if !strings.Contains(x.Message, s) {
					continue next
				}
			}
			e.t.Logf("event %s: %s", x.Reason, x.Message)
			return nil
		}
		return fmt.Errorf("%d events, none %s containing %q", len(list.Items), reason, subs)
	})
}

// TestServiceTypesAsConsulK8s: with default flags (the chart's), each
// Service type registers what consul-k8s registers; a node address change,
// an LB ingress added or removed, an external IP added and a type change
// ClusterIP -> NodePort -> LoadBalancer each cost one transaction for the
// affected Service only, and idle costs nothing.
func TestServiceTypesAsConsulK8s(t *testing.T) {
	e := newTypesEnv(t)
	e.node("n1", internalIP("192.0.2.1"), externalIP("198.51.100.1"))
	e.node("n2", internalIP("192.0.2.2"))
	ready := func(ip, pod, node string) fixture.EP { return fixture.EP{IP: ip, Pod: pod, Node: node} }

	e.service("np", corev1.ServiceTypeNodePort, nil,
		ready("10.20.0.1", "a", "n1"), ready("10.20.0.2", "b", "n1"), ready("10.20.0.3", "c", "n2"))
	e.service("lb", corev1.ServiceTypeLoadBalancer, map[string]string{"consul.hashicorp.com/service-weight": "5"},
		ready("10.20.1.1", "d", "n1"))
	e.service("ext", corev1.ServiceTypeClusterIP, nil, ready("10.20.2.1", "e", "n2"))
	e.edit("ext", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.20"} })
	e.service("cip", corev1.ServiceTypeClusterIP, nil, ready("10.20.3.1", "f", "n2"))
	np := e.nodePort("np")
	e.daemon()

	// NodePort: one instance per node with endpoints, ExternalIP first.
	e.waitInstances("np", fmt.Sprintf("192.0.2.2:%d=passing,198.51.100.1:%d=passing", np, np))
	// LoadBalancer: nothing until provisioned.
	e.waitInstances("lb", "")
	e.waitInstances("ext", "203.0.113.20:80=passing")
	e.waitInstances("cip", "10.20.3.1:8080=passing")
	e.idle(3 * time.Second)

	e.oneTxn("LB ingress added", "lb", "203.0.113.10:80=passing,lb.example.com:80=passing", func() {
		must(t, e.setLB("lb", corev1.LoadBalancerIngress{IP: "203.0.113.10"}, corev1.LoadBalancerIngress{Hostname: "lb.example.com"}))
	})
	entries, _, err := consul.Client.Catalog().Service("lb", "", nil)
	must(t, err)
	for _, s := range entries {
		if s.ServiceWeights.Passing != 5 {
			t.Errorf("lb %s: Weights %+v, want Passing 5 (service-weight)", s.ServiceAddress, s.ServiceWeights)
		}
	}
	e.oneTxn("LB ingress removed", "lb", "lb.example.com:80=passing", func() {
		must(t, e.setLB("lb", corev1.LoadBalancerIngress{Hostname: "lb.example.com"}))
	})
	e.oneTxn("node address changed (np has endpoints on it, cip too but does not use it)", "np",
		fmt.Sprintf("192.0.2.22:%d=passing,198.51.100.1:%d=passing", np, np), func() {
			e.node("n2", internalIP("192.0.2.22"))
		})
	e.oneTxn("externalIP added", "ext", "203.0.113.20:80=passing,203.0.113.21:80=passing", func() {
		e.edit("ext", func(s *corev1.Service) { s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, "203.0.113.21") })
	})
	e.oneTxn("endpoint of an LB Service not ready: the LB instance turns critical", "lb", "lb.example.com:80=critical", func() {
		must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, "lb", "lb-1", discoveryv1.AddressTypeIPv4,
			map[string]int32{"http": 8080}, []fixture.EP{{IP: "10.20.1.1", NotReady: true, Pod: "d", Node: e.nodeName("n1")}})))
	})

	// ClusterIP -> NodePort -> LoadBalancer.
	before := catalogTxns(t)
	cipNodePort := e.edit("cip", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	e.waitInstances("cip", fmt.Sprintf("192.0.2.22:%d=passing", cipNodePort))
	time.Sleep(2 * time.Second) // a measurement interval
	if n := catalogTxns(t) - before; n != 1 {
		t.Errorf("ClusterIP -> NodePort: %v catalog transactions, want 1", n)
	}
	e.oneTxn("NodePort -> LoadBalancer (not provisioned: nothing)", "cip", "", func() {
		e.edit("cip", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
	})
	e.oneTxn("LoadBalancer provisioned", "cip", "203.0.113.30:80=passing", func() {
		must(t, e.setLB("cip", corev1.LoadBalancerIngress{IP: "203.0.113.30"}))
	})
	e.idle(5 * time.Second)
}

// TestServiceTypeFlags: each consul-k8s flag switches as it does there, and
// --consul-k8s-meta writes consul-k8s's meta keys.
func TestServiceTypeFlags(t *testing.T) {
	t.Run("ExternalOnly, no ClusterIP, LB endpoints", func(t *testing.T) {
		e := newTypesEnv(t)
		e.node("n1", internalIP("192.0.2.1"), externalIP("198.51.100.1"))
		e.node("n2", internalIP("192.0.2.2"))
		e.service("np", corev1.ServiceTypeNodePort, nil,
			fixture.EP{IP: "10.21.0.1", Node: "n1"}, fixture.EP{IP: "10.21.0.2", Node: "n2"})
		e.service("lb", corev1.ServiceTypeLoadBalancer, nil, fixture.EP{IP: "10.21.1.1", Node: "n1"})
		must(t, e.setLB("lb", corev1.LoadBalancerIngress{IP: "203.0.113.10"}))
		e.service("cip", corev1.ServiceTypeClusterIP, nil, fixture.EP{IP: "10.21.2.1"})
		np := e.nodePort("np")
		e.daemon("--node-port-sync-type=ExternalOnly", "--sync-clusterip-services=false", "--sync-lb-services-endpoints")
		e.waitInstances("np", fmt.Sprintf("198.51.100.1:%d=passing", np))
		e.waitInstances("lb", "10.21.1.1:8080=passing")
		e.waitEvent("np", "InstanceSkipped", e.ns+"/np", "node "+e.nodeName("n2")+" has no ExternalIP in status.addresses", "ExternalOnly")
		e.waitInstances("cip", "")
		// The node gains an ExternalIP: np gets it, one transaction.
		e.oneTxn("ExternalIP added to a node", "np", fmt.Sprintf("198.51.100.1:%d=passing,198.51.100.2:%d=passing", np, np), func() {
			e.node("n2", internalIP("192.0.2.2"), externalIP("198.51.100.2"))
		})
	})
	t.Run("InternalOnly", func(t *testing.T) {
		e := newTypesEnv(t)
		e.node("n1", internalIP("192.0.2.1"), externalIP("198.51.100.1"))
		e.service("np", corev1.ServiceTypeNodePort, nil, fixture.EP{IP: "10.22.0.1", Node: "n1", Pod: "p1"})
		np := e.nodePort("np")
		e.daemon("--node-port-sync-type=InternalOnly", "--consul-k8s-meta")
		ins := e.waitInstances("np", fmt.Sprintf("192.0.2.1:%d=passing", np))
		want := map[string]string{"external-k8s-ns": e.ns, "external-k8s-node-name": e.nodeName("n1"), "port-http": "80",
			"external-k8s-ref-kind": "Pod", "external-k8s-ref-name": "p1", "k8s-node": e.nodeName("n1"), "k8s-namespace": e.ns}
		for k, v := range want {
			if ins[0].Meta[k] != v {
				t.Errorf("meta %s = %q, want %q (all: %v)", k, ins[0].Meta[k], v, ins[0].Meta)
			}
		}
	})
	t.Run("Ingress hosts and load balancer IPs", func(t *testing.T) {
		e := newTypesEnv(t)
		e.service("web", corev1.ServiceTypeClusterIP, nil, fixture.EP{IP: "10.23.0.1"}, fixture.EP{IP: "10.23.0.2"})
		e.service("secure", corev1.ServiceTypeClusterIP, nil, fixture.EP{IP: "10.23.1.1"})
		e.service("api", corev1.ServiceTypeClusterIP, nil, fixture.EP{IP: "10.23.2.1"})
		e.ingress("web", "web.example.com", "/", "web", false)
		e.ingress("secure", "secure.example.com", "/", "secure", true)
		e.ingress("api", "api.example.com", "/api", "api", false) // no "/" path: not used
		e.daemon("--enable-ingress")
		e.waitInstances("web", "web.example.com:80=passing")
		e.waitInstances("secure", "secure.example.com:443=passing")
		e.waitInstances("api", "10.23.2.1:8080=passing")
		// The Ingress goes: the endpoints are back, one transaction.
		e.oneTxn("Ingress deleted", "web", "10.23.0.1:8080=passing,10.23.0.2:8080=passing", func() {
			must(t, kube.Client.NetworkingV1().Ingresses(e.ns).Delete(e.ctx, "web", metav1.DeleteOptions{}))
		})

		e2 := newTypesEnv(t)
		e2.service("web", corev1.ServiceTypeClusterIP, nil, fixture.EP{IP: "10.23.3.1"})
		e2.ingress("web", "web.example.com", "/", "web", false)
		e2.daemon("--enable-ingress", "--loadbalancer-ips")
		e2.waitInstances("web", "10.23.3.1:8080=passing") // no Ingress LB IP yet: the rule is not used
		e2.oneTxn("Ingress LB provisioned", "web", "203.0.113.40:80=passing", func() {
			ing, err := kube.Client.NetworkingV1().Ingresses(e2.ns).Get(e2.ctx, "web", metav1.GetOptions{})
			must(t, err)
			ing.Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{IP: "203.0.113.40"}}
			_, err = kube.Client.NetworkingV1().Ingresses(e2.ns).UpdateStatus(e2.ctx, ing, metav1.UpdateOptions{})
			must(t, err)
		})
	})
}

// TestServiceTypeBadInput: what the API server lets through and fleetsync
// cannot use is reported with an Event naming the Service and the field,
// and the rest of the Service is still synced.
func TestServiceTypeBadInput(t *testing.T) {
	e := newTypesEnv(t)
	e.service("lb", corev1.ServiceTypeLoadBalancer, map[string]string{"consul.hashicorp.com/service-weight": "heavy"}, fixture.EP{IP: "10.24.0.1"})
	// The API server refuses an LB hostname that is not a DNS name itself.
	if err := e.setLB("lb", corev1.LoadBalancerIngress{Hostname: "not_a_dns_name"}); err == nil {
		t.Errorf("the API server took hostname not_a_dns_name; fleetsync skips it (unit-tested), expected a refusal here")
	} else {
		t.Logf("API server refuses a bad LB hostname: %v", err)
	}
	must(t, e.setLB("lb", corev1.LoadBalancerIngress{IP: "203.0.113.50"}))
	e.service("np", corev1.ServiceTypeNodePort, nil, fixture.EP{IP: "10.24.1.1"}, fixture.EP{IP: "10.24.1.2", Node: "gone"})
	e.daemon()
	e.waitInstances("lb", "203.0.113.50:80=passing")
	e.waitEvent("lb", "InvalidAnnotation", e.ns+"/lb", "consul.hashicorp.com/service-weight", `"heavy"`)
	e.waitInstances("np", "")
	e.waitEvent("np", "InstanceSkipped", e.ns+"/np", "endpoint 10.24.1.1 has no nodeName")
	e.waitEvent("np", "InstanceSkipped", e.ns+"/np", "node "+e.nodeName("gone")+" of endpoint 10.24.1.2 is not known")
	// The node appears: its address is registered.
	e.node("gone", internalIP("192.0.2.9"))
	e.waitInstances("np", fmt.Sprintf("192.0.2.9:%d=passing", e.nodePort("np")))
}

// ingress creates Ingress name with one rule host -> path -> Service svc
// port 80, host under spec.tls when tls.
func (e *typesEnv) ingress(name, host, path, svc string, tls bool) {
	e.t.Helper()
	pt := networkingv1.PathTypePrefix
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{
			Host: host,
			IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
				Paths: []networkingv1.HTTPIngressPath{{Path: path, PathType: &pt, Backend: networkingv1.IngressBackend{
					Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Number: 80}},
				}}},
			}},
		}}},
	}
	if tls {
		ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{host}, SecretName: name + "-tls"}}
	}
	_, err := kube.Client.NetworkingV1().Ingresses(e.ns).Create(e.ctx, ing, metav1.CreateOptions{})
	must(e.t, err)
}
