package k8s

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// TestServiceMerge builds the view of shop/web through a started Watcher
// on a fake clientset holding the case's EndpointSlices.
func TestServiceMerge(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	http := map[string]int32{"http": 8080}
	// ready is the merged form of endpoint(pod, address) with nil conditions.
	ready := func(address, pod string, ports map[string]int32) Endpoint {
		return Endpoint{Address: address, Ports: ports, Ready: true, Serving: true, Pod: pod, Node: "node-" + pod, Zone: "zone-a"}
	}

	tests := []struct {
		name     string
		slices   []*discoveryv1.EndpointSlice
		want     []Endpoint
		problems []string
	}{
		{
			name: "no slices",
		},
		{
			name: "one slice, nil conditions mean ready and serving",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p2", "10.0.0.2"), endpoint("p1", "10.0.0.1")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", http), ready("10.0.0.2", "p2", http)},
		},
		{
			name: "multiple slices merged and sorted by address",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-b", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p3", "10.0.0.3"), endpoint("p10", "10.0.0.10")),
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p2", "10.0.0.2")),
			},
			want: []Endpoint{ready("10.0.0.10", "p10", http), ready("10.0.0.2", "p2", http), ready("10.0.0.3", "p3", http)},
		},
		{
			name: "IPv4 and IPv6 slices, IPv6 canonicalised",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-v4", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p1", "10.0.0.1")),
				newTestSlice("shop", "web-v6", "web", v6, ports(namedPort("http", 8080)),
					endpoint("p1", "2001:DB8:0:0:0:0:0:1")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", http), ready("2001:db8::1", "p1", http)},
		},
		{
			name: "every address of an endpoint is used",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p1", "10.0.0.1", "10.0.1.1")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", http), ready("10.0.1.1", "p1", http)},
		},
		{
			name: "duplicate address across slices: ports united, ready copy wins, first known pod",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080), namedPort("admin", 9000)),
					withConditions(discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}}, no, no, yes)),
				newTestSlice("shop", "web-b", "web", v4, ports(namedPort("metrics", 9090), namedPort("admin", 9001)),
					withConditions(endpoint("p1", "10.0.0.1"), yes, yes, no)),
			},
			want: []Endpoint{{
				Address: "10.0.0.1", Ports: map[string]int32{"http": 8080, "metrics": 9090, "admin": 9000},
				Ready: true, Serving: true, Terminating: false, Pod: "p1", Node: "node-p1", Zone: "zone-a",
			}},
			problems: []string{`EndpointSlice shop/web-b: endpoints[0].addresses[0] "10.0.0.1": port "admin" is 9001 here but 9000 in an earlier copy of the address, kept 9000`},
		},
		{
			name: "a duplicate's ports reach only its own address, not the others of its slice",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p1", "10.0.0.1"), endpoint("p2", "10.0.0.2")),
				newTestSlice("shop", "web-b", "web", v4, ports(namedPort("metrics", 9090)),
					endpoint("p1", "10.0.0.1")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", map[string]int32{"http": 8080, "metrics": 9090}), ready("10.0.0.2", "p2", http)},
		},
		{
			name: "duplicate address, both terminating, stays terminating",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					withConditions(endpoint("p1", "10.0.0.1"), no, yes, yes)),
				newTestSlice("shop", "web-b", "web", v4, ports(namedPort("http", 8080)),
					withConditions(endpoint("p1", "10.0.0.1"), no, no, yes)),
			},
			want: []Endpoint{{Address: "10.0.0.1", Ports: http, Serving: true, Terminating: true, Pod: "p1", Node: "node-p1", Zone: "zone-a"}},
		},
		{
			name: "nil serving follows ready, nil terminating is false",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					withConditions(endpoint("p1", "10.0.0.1"), no, nil, nil),
					withConditions(endpoint("p2", "10.0.0.2"), yes, nil, nil)),
			},
			want: []Endpoint{
				{Address: "10.0.0.1", Ports: http, Pod: "p1", Node: "node-p1", Zone: "zone-a"},
				ready("10.0.0.2", "p2", http),
			},
		},
		{
			name: "terminating but still serving",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					withConditions(endpoint("p1", "10.0.0.1"), no, yes, yes)),
			},
			want: []Endpoint{{Address: "10.0.0.1", Ports: http, Serving: true, Terminating: true, Pod: "p1", Node: "node-p1", Zone: "zone-a"}},
		},
		{
			name: "FQDN slice ignored with a problem",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)), endpoint("p1", "10.0.0.1")),
				newTestSlice("shop", "web-fqdn", "web", discoveryv1.AddressTypeFQDN, ports(namedPort("http", 8080)),
					endpoint("p9", "db.example.com")),
			},
			want:     []Endpoint{ready("10.0.0.1", "p1", http)},
			problems: []string{"EndpointSlice shop/web-fqdn: addressType FQDN is not supported, ignored"},
		},
		{
			name: "bad addresses skipped with problems",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p1", "10.0.0.1"), endpoint("p2", "x"), endpoint("p3", "2001:db8::3"),
					discoveryv1.Endpoint{}),
				newTestSlice("shop", "web-b", "web", v6, ports(namedPort("http", 8080)),
					endpoint("p4", "fe80::1%eth0", "10.0.0.4")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", http)},
			problems: []string{
				`EndpointSlice shop/web-a: endpoints[1].addresses[0] "x": not an IP address`,
				`EndpointSlice shop/web-a: endpoints[2].addresses[0] "2001:db8::3": not an IPv4 address in an IPv4 slice`,
				`EndpointSlice shop/web-a: endpoints[3]: no addresses, ignored`,
				`EndpointSlice shop/web-b: endpoints[0].addresses[0] "fe80::1%eth0": IPv6 zones are not supported`,
				`EndpointSlice shop/web-b: endpoints[0].addresses[1] "10.0.0.4": not an IPv6 address in an IPv6 slice`,
			},
		},
		{
			name: "unnamed port",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(discoveryv1.EndpointPort{Port: ptr.To[int32](80)}),
					endpoint("p1", "10.0.0.1")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", map[string]int32{"": 80})},
		},
		{
			name: "nil port skipped with a problem",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4,
					ports(namedPort("http", 8080), discoveryv1.EndpointPort{Name: ptr.To("grpc")}, namedPort("big", 70000), namedPort("http", 8081)),
					endpoint("p1", "10.0.0.1")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", http)},
			problems: []string{
				`EndpointSlice shop/web-a: ports[1] "grpc": port is nil, skipped`,
				`EndpointSlice shop/web-a: ports[2] "big": port 70000 is out of range, skipped`,
				`EndpointSlice shop/web-a: ports[3] "http": duplicate port name, skipped`,
			},
		},
		{
			name: "all ports form: no ports, no problem",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(discoveryv1.EndpointPort{}), endpoint("p1", "10.0.0.1")),
				newTestSlice("shop", "web-b", "web", v4, nil, endpoint("p2", "10.0.0.2")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", map[string]int32{}), ready("10.0.0.2", "p2", map[string]int32{})},
		},
		{
			name: "location fields over Consul's meta value limit left out, endpoints kept",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-abc", "web", v4, ports(namedPort("http", 8080)),
					endpoint("p0", "10.0.0.10"),
					withLocation(endpoint("p1", "10.0.0.11"), "", "", strings.Repeat("z", 600)),
					withLocation(endpoint("p2", "10.0.0.12"), "", strings.Repeat("n", 513), ""),
					withLocation(endpoint("p3", "10.0.0.13"), strings.Repeat("p", 1000), "", ""),
					withLocation(endpoint("p4", "10.0.0.14", "10.0.1.14"), strings.Repeat("p", 600), strings.Repeat("n", 600), strings.Repeat("z", 600))),
			},
			want: []Endpoint{
				ready("10.0.0.10", "p0", http),
				{Address: "10.0.0.11", Ports: http, Ready: true, Serving: true, Pod: "p1", Node: "node-p1"},
				{Address: "10.0.0.12", Ports: http, Ready: true, Serving: true, Pod: "p2", Zone: "zone-a"},
				{Address: "10.0.0.13", Ports: http, Ready: true, Serving: true, Node: "node-p3", Zone: "zone-a"},
				{Address: "10.0.0.14", Ports: http, Ready: true, Serving: true},
				{Address: "10.0.1.14", Ports: http, Ready: true, Serving: true},
			},
			problems: []string{ // one per field, not per address
				"EndpointSlice shop/web-abc: endpoints[1].zone: 600 bytes, over Consul's 512 for a meta value: left out",
				"EndpointSlice shop/web-abc: endpoints[2].nodeName: 513 bytes, over Consul's 512 for a meta value: left out",
				"EndpointSlice shop/web-abc: endpoints[3].targetRef.name: 1000 bytes, over Consul's 512 for a meta value: left out",
				"EndpointSlice shop/web-abc: endpoints[4].nodeName: 600 bytes, over Consul's 512 for a meta value: left out",
				"EndpointSlice shop/web-abc: endpoints[4].targetRef.name: 600 bytes, over Consul's 512 for a meta value: left out",
				"EndpointSlice shop/web-abc: endpoints[4].zone: 600 bytes, over Consul's 512 for a meta value: left out",
			},
		},
		{
			name: "location fields of exactly 512 bytes kept, multi-byte characters counted in bytes",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					withLocation(endpoint("p1", "10.0.0.1"), strings.Repeat("p", 512), strings.Repeat("n", 512), strings.Repeat("é", 256)),
					withLocation(endpoint("p2", "10.0.0.2"), "", "", strings.Repeat("é", 257))),
			},
			want: []Endpoint{
				{Address: "10.0.0.1", Ports: http, Ready: true, Serving: true, Pod: strings.Repeat("p", 512), Node: strings.Repeat("n", 512), Zone: strings.Repeat("é", 256)},
				{Address: "10.0.0.2", Ports: http, Ready: true, Serving: true, Pod: "p2", Node: "node-p2"},
			},
			problems: []string{"EndpointSlice shop/web-a: endpoints[1].zone: 514 bytes, over Consul's 512 for a meta value: left out"},
		},
		{
			name: "location fields that are not valid UTF-8 left out",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					withLocation(endpoint("p1", "10.0.0.1"), "pod-\xff", "node-\xc3", "zone-\x80")),
			},
			want: []Endpoint{{Address: "10.0.0.1", Ports: http, Ready: true, Serving: true}},
			problems: []string{
				"EndpointSlice shop/web-a: endpoints[0].nodeName: not valid UTF-8, which Consul cannot store as it is: left out",
				"EndpointSlice shop/web-a: endpoints[0].targetRef.name: not valid UTF-8, which Consul cannot store as it is: left out",
				"EndpointSlice shop/web-a: endpoints[0].zone: not valid UTF-8, which Consul cannot store as it is: left out",
			},
		},
		{
			name: "a field left out in one copy of an address is filled in from another",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					withLocation(endpoint("p1", "10.0.0.1"), "", "", strings.Repeat("z", 600))),
				newTestSlice("shop", "web-b", "web", v4, ports(namedPort("http", 8080)), endpoint("p1", "10.0.0.1")),
			},
			want:     []Endpoint{ready("10.0.0.1", "p1", http)},
			problems: []string{"EndpointSlice shop/web-a: endpoints[0].zone: 600 bytes, over Consul's 512 for a meta value: left out"},
		},
		{
			name: "targetRef of another kind and fields Consul never sees are not checked",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)),
					withHostnameAndHints(withTargetRef(endpoint("p1", "10.0.0.1"), strings.Repeat("K", 600), strings.Repeat("x", 600)), strings.Repeat("h", 600), strings.Repeat("z", 600))),
			},
			want: []Endpoint{{Address: "10.0.0.1", Ports: http, Ready: true, Serving: true, Node: "node-p1", Zone: "zone-a"}},
		},
		{
			name: "slices of other services and unlabelled slices are not merged",
			slices: []*discoveryv1.EndpointSlice{
				newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)), endpoint("p1", "10.0.0.1")),
				newTestSlice("shop", "api-a", "api", v4, ports(namedPort("http", 8080)), endpoint("p2", "10.0.0.2")),
				newTestSlice("shop", "loose", "", v4, ports(namedPort("http", 8080)), endpoint("p3", "10.0.0.3")),
				newTestSlice("other", "web-a", "web", v4, ports(namedPort("http", 8080)), endpoint("p4", "10.0.0.4")),
			},
			want: []Endpoint{ready("10.0.0.1", "p1", http)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := []runtime.Object{newTestService("shop", "web", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})}
			for _, s := range tt.slices {
				objs = append(objs, s)
			}
			w, _ := startWatcher(t, fake.NewClientset(objs...), 0)

			got, ok, err := w.Service(Key{Namespace: "shop", Name: "web"})
			if err != nil || !ok {
				t.Fatalf("Service() = _, %v, %v; want the service", ok, err)
			}
			if !reflect.DeepEqual(got.Endpoints, tt.want) {
				t.Errorf("Endpoints:\n got %s\nwant %s", dump(got.Endpoints), dump(tt.want))
			}
			if !reflect.DeepEqual(got.Problems, tt.problems) {
				t.Errorf("Problems:\n got %q\nwant %q", got.Problems, tt.problems)
			}
		})
	}
}

// withLocation replaces the non-empty ones of pod (targetRef.name), node
// and zone.
func withLocation(ep discoveryv1.Endpoint, pod, node, zone string) discoveryv1.Endpoint {
	if pod != "" {
		ref := *ep.TargetRef
		ref.Name = pod
		ep.TargetRef = &ref
	}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	if zone != "" {
		ep.Zone = ptr.To(zone)
	}
	return ep
}

func withTargetRef(ep discoveryv1.Endpoint, kind, name string) discoveryv1.Endpoint {
	ep.TargetRef = &corev1.ObjectReference{Kind: kind, Namespace: "shop", Name: name}
	return ep
}

func withHostnameAndHints(ep discoveryv1.Endpoint, hostname, hintZone string) discoveryv1.Endpoint {
	ep.Hostname = ptr.To(hostname)
	ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: hintZone}}}
	return ep
}

func dump(eps []Endpoint) string {
	s := ""
	for _, e := range eps {
		s += fmt.Sprintf("\n  %+v", e)
	}
	return s
}

// TestServiceView checks the spec part of the view and that the view is
// built from the cache without deep copies.
func TestServiceView(t *testing.T) {
	svc := newTestService("shop", "web",
		corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	svc.Spec.Type = corev1.ServiceTypeNodePort
	w, _ := startWatcher(t, fake.NewClientset(svc), 0)

	got, ok, err := w.Service(Key{Namespace: "shop", Name: "web"})
	if err != nil || !ok {
		t.Fatalf("Service() = _, %v, %v; want the service", ok, err)
	}
	want := &Service{
		Key:         Key{Namespace: "shop", Name: "web"},
		UID:         "uid-web",
		Type:        corev1.ServiceTypeNodePort,
		Annotations: map[string]string{"consul.hashicorp.com/service-sync": "true"},
		Ports: []Port{
			{Name: "http", Port: 80, NodePort: 30080, Protocol: "TCP"},
			{Name: "dns", Port: 53, Protocol: "UDP"},
		},
		Object: got.Object,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Service() =\n %+v\nwant\n %+v", got, want)
	}
	again, _, _ := w.Service(Key{Namespace: "shop", Name: "web"})
	if again.Object != got.Object {
		t.Error("Object is copied on each call, want the cached object")
	}
}
