package worker

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// summary is what a table row asserts of one instance.
func summary(in consul.Instance) string {
	s := fmt.Sprintf("%s:%d %s", in.Address, in.Port, in.Check.Status)
	if in.Weight != 0 {
		s += fmt.Sprintf(" w=%d", in.Weight)
	}
	return s
}

func typed(t corev1.ServiceType, opts ...svcOpt) svcOpt {
	return func(s *k8s.Service) {
		s.Type = t
		if t == corev1.ServiceTypeNodePort || t == corev1.ServiceTypeLoadBalancer {
			s.Ports[0].NodePort = 30080
			s.Ports[1].NodePort = 30090
		}
		for _, o := range opts {
			o(s)
		}
	}
}

func withExternalIPs(ips ...string) svcOpt {
	return func(s *k8s.Service) { s.ExternalIPs = ips }
}

func withLB(entries ...k8s.LoadBalancerIngress) svcOpt {
	return func(s *k8s.Service) { s.LoadBalancer = entries }
}

func withNodes(nodes map[string][]k8s.NodeAddress) svcOpt {
	return func(s *k8s.Service) { s.Nodes = nodes }
}

func withIngress(routes ...k8s.IngressRoute) svcOpt {
	return func(s *k8s.Service) { s.Ingresses = routes }
}

func ext(a string) k8s.NodeAddress { return k8s.NodeAddress{Type: corev1.NodeExternalIP, Address: a} }
func internal(a string) k8s.NodeAddress {
	return k8s.NodeAddress{Type: corev1.NodeInternalIP, Address: a}
}

func onNode(ep k8s.Endpoint, node string) k8s.Endpoint { ep.Node = node; return ep }

func notReadyEP(ep k8s.Endpoint) k8s.Endpoint { ep.Ready, ep.Serving = false, false; return ep }

func TestDesiredByType(t *testing.T) {
	a := onNode(ready("10.0.0.1", "a"), "n1")
	b := onNode(ready("10.0.0.2", "b"), "n1") // same node as a
	c := onNode(ready("10.0.0.3", "c"), "n2")
	nodes := map[string][]k8s.NodeAddress{
		"n1": {internal("192.168.0.1"), ext("203.0.113.1"), ext("203.0.113.9")},
		"n2": {internal("192.168.0.2")}, // no ExternalIP
	}
	lb := withLB(k8s.LoadBalancerIngress{IP: "198.51.100.1"}, k8s.LoadBalancerIngress{Hostname: "lb.example.com"},
		k8s.LoadBalancerIngress{IP: "198.51.100.1"})
	route := k8s.IngressRoute{Ingress: "shop/web", Host: "web.example.com", LoadBalancerIP: "198.51.100.7"}
	tlsRoute := k8s.IngressRoute{Ingress: "shop/web-tls", Host: "secure.example.com", TLS: true}

	tests := []struct {
		name    string
		svc     *k8s.Service
		cfg     func(*Config)
		want    []string // summaries, sorted
		skipped []string // substrings, one per Spec.Skipped entry
		warn    []string // substrings, one per Spec.Warnings entry
	}{
		{name: "ClusterIP: endpoints", svc: newSvc([]k8s.Endpoint{a, c}),
			want: []string{"10.0.0.1:8080 passing", "10.0.0.3:8080 passing"}},
		{name: "ClusterIP with --enable-ingress off ignores Ingress routes", svc: newSvc([]k8s.Endpoint{a}, withIngress(route)),
			want: []string{"10.0.0.1:8080 passing"}},
		{name: "NodePort ExternalFirst: first ExternalIP, else InternalIP; one per node; the NodePort",
			svc:  newSvc([]k8s.Endpoint{a, b, c}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			want: []string{"192.168.0.2:30080 passing", "203.0.113.1:30080 passing"}},
		{name: "NodePort ExternalOnly: a node without ExternalIP is skipped, with a reason",
			svc:     newSvc([]k8s.Endpoint{a, c}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			cfg:     func(c *Config) { c.NodePortSync = ExternalOnly },
			want:    []string{"203.0.113.1:30080 passing"},
			skipped: []string{"node n2 has no ExternalIP in status.addresses (--node-port-sync-type=ExternalOnly)"}},
		{name: "NodePort InternalOnly",
			svc:  newSvc([]k8s.Endpoint{a, c}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			cfg:  func(c *Config) { c.NodePortSync = InternalOnly },
			want: []string{"192.168.0.1:30080 passing", "192.168.0.2:30080 passing"}},
		{name: "NodePort: service-port by name picks that port's NodePort",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeNodePort, withNodes(nodes)), withAnn(AnnotationPort, "metrics")),
			want: []string{"203.0.113.1:30090 passing"}},
		{name: "NodePort: service-port by number",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeNodePort, withNodes(nodes)), withAnn(AnnotationPort, "31000")),
			want: []string{"203.0.113.1:31000 passing"}},
		{name: "NodePort: the node check is passing when one endpoint on it is ready",
			svc:  newSvc([]k8s.Endpoint{notReadyEP(a), b}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			want: []string{"203.0.113.1:30080 passing"}},
		{name: "NodePort: a node with only not-ready endpoints is left out (as endpoints are)",
			svc:  newSvc([]k8s.Endpoint{notReadyEP(a), c}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			want: []string{"192.168.0.2:30080 passing"}},
		{name: "NodePort with --register-not-ready: that node is critical",
			svc:  newSvc([]k8s.Endpoint{notReadyEP(a), c}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			cfg:  func(c *Config) { c.RegisterNotReady = true },
			want: []string{"192.168.0.2:30080 passing", "203.0.113.1:30080 critical"}},
		{name: "NodePort: an endpoint without nodeName and an unknown node are skipped",
			svc:     newSvc([]k8s.Endpoint{onNode(a, ""), onNode(c, "n9")}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			skipped: []string{"endpoint 10.0.0.1 has no nodeName", "node n9 of endpoint 10.0.0.3 is not known"}},
		{name: "NodePort: a node address that is not an IP is skipped, an IPv6 one canonical",
			svc: newSvc([]k8s.Endpoint{a, c}, typed(corev1.ServiceTypeNodePort, withNodes(map[string][]k8s.NodeAddress{
				"n1": {ext("node-1.example.com")}, "n2": {internal("FD00:0::2")}}))),
			want:    []string{"fd00::2:30080 passing"},
			skipped: []string{`node n1: status.addresses "node-1.example.com": not an IP address`}},
		{name: "LoadBalancer: one per ingress IP or hostname (deduped), the Service port, check from the endpoints",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer, lb)),
			want: []string{"198.51.100.1:80 passing", "lb.example.com:80 passing"}},
		{name: "LoadBalancer not provisioned: nothing",
			svc: newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer))},
		{name: "LoadBalancer without endpoints: critical",
			svc:  newSvc(nil, typed(corev1.ServiceTypeLoadBalancer, lb)),
			want: []string{"198.51.100.1:80 critical", "lb.example.com:80 critical"}},
		{name: "LoadBalancer with only terminating endpoints: warning",
			svc:  newSvc([]k8s.Endpoint{{Address: "10.0.0.5", Serving: true, Terminating: true}}, typed(corev1.ServiceTypeLoadBalancer, lb)),
			want: []string{"198.51.100.1:80 warning", "lb.example.com:80 warning"}},
		{name: "LoadBalancer with only terminating endpoints, --terminating=drop: critical",
			svc:  newSvc([]k8s.Endpoint{{Address: "10.0.0.5", Serving: true, Terminating: true}}, typed(corev1.ServiceTypeLoadBalancer, withLB(k8s.LoadBalancerIngress{IP: "198.51.100.1"}))),
			cfg:  func(c *Config) { c.Terminating = TerminatingDrop },
			want: []string{"198.51.100.1:80 critical"}},
		{name: "NodePort ExternalFirst: a node with neither address is skipped",
			svc:     newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeNodePort, withNodes(map[string][]k8s.NodeAddress{"n1": {{Type: corev1.NodeHostName, Address: "n1"}}}))),
			skipped: []string{"node n1 has no ExternalIP or InternalIP in status.addresses (--node-port-sync-type=ExternalFirst)"}},
		{name: "NodePort: a node with only terminating endpoints is warning",
			svc:  newSvc([]k8s.Endpoint{onNode(k8s.Endpoint{Address: "10.0.0.5", Serving: true, Terminating: true, Ports: map[string]int32{"http": 8080}}, "n1")}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			want: []string{"203.0.113.1:30080 warning"}},
		{name: "LoadBalancer --sync-lb-services-endpoints: the endpoints",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer, lb)),
			cfg:  func(c *Config) { c.SyncLoadBalancerEndpoints = true },
			want: []string{"10.0.0.1:8080 passing"}},
		{name: "LoadBalancer: a hostname that is not a DNS name and a bad IP are skipped",
			svc: newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer,
				withLB(k8s.LoadBalancerIngress{Hostname: "bad_host!"}, k8s.LoadBalancerIngress{IP: "300.1.1.1"}, k8s.LoadBalancerIngress{IP: "198.51.100.2"}))),
			want:    []string{"198.51.100.2:80 passing"},
			skipped: []string{`status.loadBalancer.ingress[0].hostname "bad_host!": not a valid DNS name`, `status.loadBalancer.ingress[1].ip "300.1.1.1": not an IP address`}},
		{name: "LoadBalancer: service-weight",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer, withLB(k8s.LoadBalancerIngress{IP: "198.51.100.1"})), withAnn(AnnotationWeight, "5")),
			want: []string{"198.51.100.1:80 passing w=5"}},
		{name: "service-weight 1 is refused (consul-k8s wants > 1)",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer, withLB(k8s.LoadBalancerIngress{IP: "198.51.100.1"})), withAnn(AnnotationWeight, "1")),
			want: []string{"198.51.100.1:80 passing"},
			warn: []string{"service-weight=\"1\": must be an integer greater than 1"}},
		{name: "externalIPs on ClusterIP: the Service port, take precedence over endpoints",
			svc:  newSvc([]k8s.Endpoint{a}, withExternalIPs("203.0.113.50", "203.0.113.51")),
			want: []string{"203.0.113.50:80 passing", "203.0.113.51:80 passing"}},
		{name: "externalIPs on NodePort: the NodePort",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeNodePort, withNodes(nodes), withExternalIPs("203.0.113.50"))),
			want: []string{"203.0.113.50:30080 passing"}},
		{name: "externalIPs on LoadBalancer take precedence over the ingress, with weight",
			svc:  newSvc(nil, typed(corev1.ServiceTypeLoadBalancer, lb, withExternalIPs("203.0.113.50", "nope"), withAnn(AnnotationWeight, "3"))),
			want: []string{"203.0.113.50:80 critical w=3"}, skipped: []string{`spec.externalIPs[1] "nope": not an IP address`}},
		{name: "service-weight is not used on endpoints",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationWeight, "5")),
			want: []string{"10.0.0.1:8080 passing"}},
		{name: "Ingress: the host, port 80, for a ClusterIP Service",
			svc:  newSvc([]k8s.Endpoint{a, c}, withIngress(route)),
			cfg:  func(c *Config) { c.EnableIngress = true },
			want: []string{"web.example.com:80 passing"}},
		{name: "Ingress: host under spec.tls gets 443",
			svc:  newSvc([]k8s.Endpoint{notReadyEP(a)}, withIngress(tlsRoute)),
			cfg:  func(c *Config) { c.EnableIngress = true },
			want: []string{"secure.example.com:443 critical"}},
		{name: "Ingress --loadbalancer-ips: the Ingress LB IP; a route without one is not used",
			svc:  newSvc([]k8s.Endpoint{a}, withIngress(route, tlsRoute)),
			cfg:  func(c *Config) { c.EnableIngress, c.IngressLoadBalancerIPs = true, true },
			want: []string{"198.51.100.7:80 passing"}},
		{name: "Ingress without endpoints: nothing, as consul-k8s",
			svc: newSvc(nil, withIngress(route)),
			cfg: func(c *Config) { c.EnableIngress = true }},
		{name: "Ingress route without host: the endpoints",
			svc:  newSvc([]k8s.Endpoint{a}, withIngress(k8s.IngressRoute{Ingress: "shop/x"})),
			cfg:  func(c *Config) { c.EnableIngress = true },
			want: []string{"10.0.0.1:8080 passing"}},
		{name: "Ingress does not apply to NodePort",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeNodePort, withNodes(nodes), withIngress(route))),
			cfg:  func(c *Config) { c.EnableIngress = true },
			want: []string{"203.0.113.1:30080 passing"}},
		{name: "Ingress applies to LoadBalancer synced by endpoints",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer, lb, withIngress(route))),
			cfg:  func(c *Config) { c.EnableIngress, c.SyncLoadBalancerEndpoints = true, true },
			want: []string{"web.example.com:80 passing"}},
		{name: "Ingress does not apply to LoadBalancer synced by ingress",
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer, lb, withIngress(route))),
			cfg:  func(c *Config) { c.EnableIngress = true },
			want: []string{"198.51.100.1:80 passing", "lb.example.com:80 passing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			spec, err := Desired(tt.svc, cfg)
			if err != nil {
				t.Fatalf("Desired: %v", err)
			}
			var got []string
			for _, in := range spec.Instances {
				got = append(got, summary(in))
				if want := cfg.Cluster.InstanceID(testNS, testName, in.Address, in.Port); in.ID != want {
					t.Errorf("ID %q, want %q", in.ID, want)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("instances\n got %q\nwant %q", got, tt.want)
			}
			matchAll(t, "Skipped", spec.Skipped, tt.skipped)
			matchAll(t, "Warnings", spec.Warnings, tt.warn)
		})
	}
}

func matchAll(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %q, want one each containing %q", what, got, want)
		return
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) || !strings.Contains(got[i], "service shop/web") {
			t.Errorf("%s[%d] = %q, want it to name the Service and contain %q", what, i, got[i], want[i])
		}
	}
}

func TestDesiredConsulK8sMeta(t *testing.T) {
	a := onNode(ready("10.0.0.1", "a"), "n1")
	nodes := map[string][]k8s.NodeAddress{"n1": {ext("203.0.113.1")}}
	base := map[string]string{"external-source": "kubernetes", "k8s-cluster": "east", MetaNamespace: testNS, MetaService: testName}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	ck8s := []string{MetaK8sNS, testNS, "port-http", "80", "port-metrics", "9090"}
	tests := []struct {
		name string
		svc  *k8s.Service
		on   bool
		want map[string]string
	}{
		{name: "off: fleetsync's keys only", svc: newSvc([]k8s.Endpoint{a}),
			want: with(MetaPod, "a", MetaNode, "n1", MetaZone, "zone-a")},
		{name: "endpoint", svc: newSvc([]k8s.Endpoint{a}), on: true,
			want: with(append(ck8s, MetaPod, "a", MetaNode, "n1", MetaZone, "zone-a",
				MetaK8sRefKind, "Pod", MetaK8sRefName, "a", MetaK8sNode, "n1", MetaK8sZone, "zone-a")...)},
		{name: "NodePort: the node and the first endpoint on it", on: true,
			svc: newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeNodePort, withNodes(nodes))),
			want: with(append(ck8s, MetaNode, "n1", MetaZone, "zone-a",
				MetaK8sRefKind, "Pod", MetaK8sRefName, "a", MetaK8sNode, "n1", MetaK8sZone, "zone-a")...)},
		{name: "LoadBalancer: the Service only", on: true,
			svc:  newSvc([]k8s.Endpoint{a}, typed(corev1.ServiceTypeLoadBalancer, withLB(k8s.LoadBalancerIngress{IP: "198.51.100.1"}))),
			want: with(ck8s...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.ConsulK8sMeta = tt.on
			spec, err := Desired(tt.svc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(spec.Instances) != 1 {
				t.Fatalf("got %d instances, want 1", len(spec.Instances))
			}
			if got := spec.Instances[0].Meta; !maps.Equal(got, tt.want) {
				t.Errorf("meta\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

// FuzzDesiredTypes: whatever the Service type, status, external IPs, node
// addresses and weight, Desired does not fail for them, every instance is
// stamped, IDs are sorted and unique, and each Skipped entry names the
// Service.
func FuzzDesiredTypes(f *testing.F) {
	f.Add(uint8(0), "203.0.113.1", "198.51.100.1", "lb.example.com", "192.0.2.1", "5")
	f.Add(uint8(1), "", "", "", "192.0.2.1", "")
	f.Add(uint8(2), "", "300.0.0.1", "bad_host", "", "heavy")
	f.Add(uint8(0xff), "fe80::1%eth0", "fd00::1", "", "::1", "1")
	f.Fuzz(func(t *testing.T, flags uint8, extIP, lbIP, lbHost, nodeAddr, w string) {
		types := []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}
		cfg := testConfig(t)
		cfg.NodePortSync = []NodePortSyncType{ExternalFirst, ExternalOnly, InternalOnly, ""}[flags>>2&3]
		cfg.SyncLoadBalancerEndpoints = flags&0x10 != 0
		cfg.EnableIngress = flags&0x20 != 0
		cfg.IngressLoadBalancerIPs = flags&0x40 != 0
		cfg.ConsulK8sMeta = flags&0x80 != 0
		a, b := onNode(ready("10.0.0.1", "a"), "n1"), onNode(notReadyEP(ready("10.0.0.2", "b")), "n2")
		opts := []svcOpt{typed(types[int(flags&3)%3],
			withNodes(map[string][]k8s.NodeAddress{"n1": {ext(nodeAddr)}, "n2": {internal(nodeAddr)}}),
			withLB(k8s.LoadBalancerIngress{IP: lbIP}, k8s.LoadBalancerIngress{Hostname: lbHost}),
			withIngress(k8s.IngressRoute{Ingress: "shop/i", Host: lbHost, LoadBalancerIP: lbIP}),
			withAnn(AnnotationWeight, w))}
		if extIP != "" {
			opts = append(opts, withExternalIPs(extIP))
		}
		spec, err := Desired(newSvc([]k8s.Endpoint{a, b}, opts...), cfg)
		if err != nil {
			t.Fatalf("Desired: %v", err)
		}
		for i, in := range spec.Instances {
			if i > 0 && in.ID <= spec.Instances[i-1].ID {
				t.Fatalf("IDs not sorted and unique: %q after %q", in.ID, spec.Instances[i-1].ID)
			}
			if in.Meta["k8s-cluster"] != "east" || in.Address == "" || in.Port <= 0 {
				t.Fatalf("instance %+v", in)
			}
		}
		for _, s := range append(spec.Skipped, spec.Warnings...) {
			if !strings.HasPrefix(s, "service shop/web") {
				t.Fatalf("problem %q does not name the Service", s)
			}
		}
	})
}
