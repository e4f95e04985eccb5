package k8s

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Port is one port of the Service spec.
type Port struct {
	Name     string
	Port     int32
	NodePort int32
	Protocol string
}

// Endpoint is one endpoint address of a Service, merged across all its
// EndpointSlices. Pod, Node and Zone are each "" or valid UTF-8 of at most
// MaxMetaValueLen bytes, so they can be Consul meta values; a slice value
// that is not is left out, with a Problem.
type Endpoint struct {
	Address     string           // one IP (v4 or v6), canonical form (netip)
	Ports       map[string]int32 // EndpointSlice port name ("" for an unnamed port) -> port; never nil, shared with the other endpoints of its slice: read-only
	Ready       bool             // conditions.ready; nil means true
	Serving     bool             // conditions.serving; nil means the value of Ready
	Terminating bool             // conditions.terminating; nil means false
	Pod         string           // targetRef name, if its kind is Pod
	Node        string           // nodeName, when known
	Zone        string           // zone, when known
}

// Service is the typed view of one Service: its spec, annotations and
// merged endpoints. It is built on demand by Watcher.Service; the slices and
// Endpoints are the caller's, Annotations and Object are shared with the
// cache.
type Service struct {
	Key
	UID         types.UID
	Type        corev1.ServiceType
	Annotations map[string]string // shared with the cache: callers must not mutate
	Ports       []Port
	Endpoints   []Endpoint // sorted by Address (string order), deduped by address
	ExternalIPs []string   // spec.externalIPs, as written
	// LoadBalancer is status.loadBalancer.ingress, as written.
	LoadBalancer []LoadBalancerIngress
	// Nodes holds the status.addresses of the Nodes of Endpoints, for a
	// NodePort Service; a Node not (yet) in the cache is absent.
	Nodes map[string][]NodeAddress
	// Ingresses are the Ingress rules that send "/" to this Service
	// (--enable-ingress only), sorted by Ingress and rule.
	Ingresses []IngressRoute
	Problems  []string        // non-fatal input problems, each naming the EndpointSlice and field; sorted
	Object    *corev1.Service // for Events (object reference); from the cache, read-only
}

// newService builds the view of svc from its EndpointSlices.
func newService(svc *corev1.Service, slices []*cachedSlice) *Service {
	endpoints, problems := mergeSlices(slices)
	return &Service{
		Key:          Key{Namespace: svc.Namespace, Name: svc.Name},
		UID:          svc.UID,
		Type:         svc.Spec.Type,
		Annotations:  svc.Annotations,
		Ports:        specPorts(svc.Spec.Ports),
		Endpoints:    endpoints,
		ExternalIPs:  svc.Spec.ExternalIPs,
		LoadBalancer: lbIngress(svc.Status.LoadBalancer.Ingress),
		Problems:     problems,
		Object:       svc,
	}
}

func specPorts(in []corev1.ServicePort) []Port {
	if len(in) == 0 {
		return nil
	}
	out := make([]Port, 0, len(in))
	for _, p := range in {
		out = append(out, Port{Name: p.Name, Port: p.Port, NodePort: p.NodePort, Protocol: string(p.Protocol)})
	}
	return out
}

// LoadBalancerIngress is one entry of status.loadBalancer.ingress.
type LoadBalancerIngress struct {
	IP       string
	Hostname string
}

func lbIngress(in []corev1.LoadBalancerIngress) []LoadBalancerIngress {
	if len(in) == 0 {
		return nil
	}
	out := make([]LoadBalancerIngress, 0, len(in))
	for _, i := range in {
		out = append(out, LoadBalancerIngress{IP: i.IP, Hostname: i.Hostname})
	}
	return out
}
