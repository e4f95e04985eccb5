package tok8s

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Update is one slice to replace: Old as read (with the mark), New desired.
type Update struct{ Old, New *discoveryv1.EndpointSlice }

// Plan is the difference between desired and actual slices.
type Plan struct {
	Create []*discoveryv1.EndpointSlice
	Update []Update
	Delete []*discoveryv1.EndpointSlice
}

// Empty reports whether the plan writes nothing.
func (p Plan) Empty() bool { return p.writes() == 0 }

// writes is the number of requests the plan sends.
func (p Plan) writes() int { return len(p.Create) + len(p.Update) + len(p.Delete) }

// Diff is the plan that turns actual (the marked slices of the Service, as
// read) into desired. Pure: it reads nothing else.
func Diff(desired, actual []*discoveryv1.EndpointSlice) Plan {
	have := make(map[string]*discoveryv1.EndpointSlice, len(actual))
	for _, s := range actual {
		have[s.Name] = s
	}
	var p Plan
	for _, d := range desired {
		a, ok := have[d.Name]
		delete(have, d.Name)
		switch {
		case !ok:
			p.Create = append(p.Create, d)
		case !SameSlice(d, a):
			p.Update = append(p.Update, Update{Old: a, New: d})
		}
	}
	for _, s := range actual {
		if _, gone := have[s.Name]; gone {
			p.Delete = append(p.Delete, s)
		}
	}
	return p
}

// SameSlice reports whether actual already holds everything fleetsync sets
// in desired: its labels (others' labels are ignored), ownerReferences,
// address type, ports and endpoints.
func SameSlice(desired, actual *discoveryv1.EndpointSlice) bool {
	for k, v := range desired.Labels {
		if actual.Labels[k] != v {
			return false
		}
	}
	return desired.AddressType == actual.AddressType &&
		equality.Semantic.DeepEqual(desired.OwnerReferences, actual.OwnerReferences) &&
		equality.Semantic.DeepEqual(desired.Ports, actual.Ports) &&
		equality.Semantic.DeepEqual(desired.Endpoints, actual.Endpoints)
}

// SameService reports whether actual already holds what fleetsync applies
// of desired: its labels and annotations (others' are ignored), kind,
// externalName and ports (the API server's defaults, such as a port's nodePort, ignored).
func SameService(desired, actual *corev1.Service) bool {
	sub := func(want, have map[string]string) bool {
		for k, v := range want {
			if have[k] != v {
				return false
			}
		}
		return true
	}
	if !sub(desired.Labels, actual.Labels) || !sub(desired.Annotations, actual.Annotations) ||
		desired.Spec.Type != actual.Spec.Type || KindOf(desired) != KindOf(actual) ||
		desired.Spec.ExternalName != actual.Spec.ExternalName || len(desired.Spec.Ports) != len(actual.Spec.Ports) {
		return false
	}
	for i, d := range desired.Spec.Ports {
		a := actual.Spec.Ports[i]
		if d.Name != a.Name || d.Port != a.Port || d.Protocol != a.Protocol || d.TargetPort != a.TargetPort {
			return false
		}
	}
	return true
}
