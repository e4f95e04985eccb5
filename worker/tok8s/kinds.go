package tok8s

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// Mirror kinds (--to-k8s-mode): what mirror mode makes of a Consul service.
const (
	// KindEndpointSlices is a selectorless ClusterIP Service with
	// EndpointSlices of the instances (the default).
	KindEndpointSlices = "endpointslices"
	// KindHeadless is a selectorless headless Service (clusterIP: None)
	// with EndpointSlices: DNS answers the instances' addresses.
	KindHeadless = "headless"
	// KindExternalName is consul-k8s's object: a Service of type
	// ExternalName pointing at <name>.service.<domain>, no ports, no
	// slices.
	KindExternalName = "externalname"
)

// DefaultDomain is Consul's DNS domain (consul-k8s's -consul-domain).
const DefaultDomain = "consul"

// AnnotationConsulK8sSync is consul-k8s's annotation that keeps its
// Kubernetes -> Consul sync off a Service; consul-k8s puts it on its
// ExternalName objects and so does fleetsync.
const AnnotationConsulK8sSync = "consul.hashicorp.com/service-sync"

// KindOf is the mirror kind a Service has.
func KindOf(svc *corev1.Service) string {
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return KindExternalName
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return KindHeadless
	}
	return KindEndpointSlices
}

// kind is the configured mirror kind (KindEndpointSlices when unset).
func (c Config) kind() string {
	if c.Kind == "" {
		return KindEndpointSlices
	}
	return c.Kind
}

// HasSlices reports whether the configured kind has EndpointSlices.
func (c Config) HasSlices() bool { return c.kind() != KindExternalName }

// shape turns the ClusterIP Service svc of u into the configured kind.
func (c Config) shape(u Unit, svc *corev1.Service) {
	switch c.kind() {
	case KindHeadless:
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	case KindExternalName:
		domain := c.Domain
		if domain == "" {
			domain = DefaultDomain
		}
		svc.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: u.ConsulName + ".service." + domain}
		svc.Annotations[AnnotationConsulK8sSync] = "false"
	}
}

// LabelConsulK8s is the label consul-k8s's catalog sync puts on the
// ExternalName Services it makes ("true").
const LabelConsulK8s = "consul"

// adoptConsulK8s returns consul-k8s's ExternalName Service of u as
// fleetsync's (--to-k8s-adopt-consul-k8s): old must be exactly the object
// consul-k8s makes of u's Consul name (label consul=true, type
// ExternalName, <name>.service.<domain>); anything else is refused. The
// Service keeps its spec, its other labels and annotations; consul-k8s's
// label goes (consul-k8s no longer owns it) and fleetsync's mark and
// annotations come. A later flush converts it to the configured kind.
func (c Config) adoptConsulK8s(u Unit, want *corev1.Service) func(old *corev1.Service) (*corev1.Service, error) {
	return func(old *corev1.Service) (*corev1.Service, error) {
		domain := c.Domain
		if domain == "" {
			domain = DefaultDomain
		}
		dns := u.ConsulName + ".service." + domain
		if old.Labels[LabelConsulK8s] != "true" || old.Spec.Type != corev1.ServiceTypeExternalName || old.Spec.ExternalName != dns {
			return nil, fmt.Errorf("%w: not consul-k8s's object of Consul service %s (label %s=true, type ExternalName, externalName %s)",
				errNotConsulK8s, u.ConsulName, LabelConsulK8s, dns)
		}
		delete(old.Labels, LabelConsulK8s)
		if old.Annotations == nil {
			old.Annotations = map[string]string{}
		}
		for k, v := range want.Annotations {
			old.Annotations[k] = v
		}
		old.Annotations[AnnotationConsulK8sSync] = "false"
		c.Mark.Stamp(old)
		return old, nil
	}
}

// errNotConsulK8s is returned, wrapped, for a Service that is not
// consul-k8s's object of the name.
var errNotConsulK8s = errors.New("refusing to adopt")
