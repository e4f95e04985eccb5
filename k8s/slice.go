package k8s

import (
	"slices"
	"unique"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

// cachedSlice is what the EndpointSlice informer keeps of a slice
// (compactSlice): the fields a Service view, the indexes and the handlers
// read. A slice as the EndpointSlice controller writes it carries labels
// copied from its Service, an owner reference, a trigger-time annotation,
// and per endpoint a full object reference and a pointer to each
// condition: 10 endpoints cost 6.9 KB decoded, 2.6 KB compacted
// (BenchmarkSliceCache; 4.6 and 2.4 KB for the benchmark program's
// minimal slices).
type cachedSlice struct {
	// ObjectMeta holds name, namespace, UID and resourceVersion only
	// (the informer keys and compares objects by them).
	metav1.ObjectMeta
	service     string // the kubernetes.io/service-name label; "" when absent
	addressType discoveryv1.AddressType
	ports       []discoveryv1.EndpointPort // as decoded
	endpoints   []cachedEndpoint
}

// cachedEndpoint is one endpoint of a cachedSlice: its addresses and
// location as written (validated when a view is built, which reports
// them), and its conditions with the API's defaults applied.
type cachedEndpoint struct {
	addresses   []string // shares one array with the slice's other endpoints
	pod         string   // targetRef.name when targetRef.kind is Pod
	node, zone  string   // interned: many endpoints share a node and a zone
	ready       bool     // conditions.ready; nil means true
	serving     bool     // conditions.serving; nil means ready
	terminating bool     // conditions.terminating; nil means false
}

// compactSlice is the EndpointSlice informer's transform: an EndpointSlice
// becomes a *cachedSlice. Anything else (a tombstone, a slice already
// compacted) is returned as it is.
func compactSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := &cachedSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion},
		service:     s.Labels[discoveryv1.LabelServiceName],
		addressType: s.AddressType,
		ports:       s.Ports,
		endpoints:   make([]cachedEndpoint, len(s.Endpoints)),
	}
	n := 0
	for i := range s.Endpoints {
		n += len(s.Endpoints[i].Addresses)
	}
	addresses := make([]string, 0, n)
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		start := len(addresses)
		addresses = append(addresses, ep.Addresses...)
		ready := ptr.Deref(ep.Conditions.Ready, true)
		c := cachedEndpoint{
			addresses:   addresses[start:len(addresses):len(addresses)],
			node:        intern(ptr.Deref(ep.NodeName, "")),
			zone:        intern(ptr.Deref(ep.Zone, "")),
			ready:       ready,
			serving:     ptr.Deref(ep.Conditions.Serving, ready),
			terminating: ptr.Deref(ep.Conditions.Terminating, false),
		}
		if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
			c.pod = ep.TargetRef.Name
		}
		out.endpoints[i] = c
	}
	return out, nil
}

// GetObjectKind and DeepCopyObject make a cachedSlice a runtime.Object,
// which client-go's watch-list consistency check
// (KUBE_WATCHLIST_INCONSISTENCY_DETECTOR) asks of what the transform
// returns; it compares them with reflect.DeepEqual.
func (s *cachedSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject returns a copy that shares nothing with s.
func (s *cachedSlice) DeepCopyObject() runtime.Object {
	out := &cachedSlice{service: s.service, addressType: s.addressType}
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if s.ports != nil {
		out.ports = make([]discoveryv1.EndpointPort, len(s.ports))
		for i := range s.ports {
			s.ports[i].DeepCopyInto(&out.ports[i])
		}
	}
	if s.endpoints != nil {
		out.endpoints = make([]cachedEndpoint, len(s.endpoints))
		for i, ep := range s.endpoints {
			ep.addresses = slices.Clone(ep.addresses)
			out.endpoints[i] = ep
		}
	}
	return out
}

// intern returns the one copy of s (package unique) that every endpoint
// naming it shares.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// serviceKey returns the Service the slice belongs to, from its
// kubernetes.io/service-name label.
func (s *cachedSlice) serviceKey() (Key, bool) {
	if s.service == "" {
		return Key{}, false
	}
	return Key{Namespace: s.Namespace, Name: s.service}, true
}
