package tok8s

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

// MaxEndpoints is the most endpoints in one slice (the EndpointSlice
// controller's default).
const MaxEndpoints = 100

// PortName is the name of a mirrored Service's port and of its slices'
// port (import mode uses the Service's own port name).
const PortName = "consul"

// AnnotationConsulService names the Consul service of a Service
// (k8smark.AnnotationConsulService).
const AnnotationConsulService = k8smark.AnnotationConsulService

// Warning and critical policies (--to-k8s-warning, --to-k8s-critical).
const (
	WarningReady     = "ready"
	WarningFallback  = "fallback"
	WarningNotReady  = "not-ready"
	CriticalNotReady = "not-ready"
	CriticalDrop     = "drop"
)

// Config is what every worker of the fleet shares.
type Config struct {
	Cluster         ownership.Cluster // this cluster: its nodes' instances never come back
	Mark            k8smark.Mark
	ExcludeTag      string   // instances with this tag are left out ("": none)
	IncludeClusters []string // other Kubernetes clusters whose instances are mirrored
	Warning         string   // WarningReady (default), WarningFallback, WarningNotReady
	Critical        string   // CriticalNotReady (default), CriticalDrop
	AddressTag      string   // a tagged address to use first (e.g. lan_ipv4); "": none
	Window          time.Duration
	Kind            string // mirror kind: KindEndpointSlices (default), KindHeadless, KindExternalName
	Domain          string // Consul's DNS domain of KindExternalName (default DefaultDomain)
	AdoptConsulK8s  bool   // consul-k8s's ExternalName Service of a mirrored name becomes fleetsync's
	// EmptyIsAnswer: an empty health answer of a mirror unit is taken (its
	// Service deleted) rather than held for the catalog to decide; set for
	// reads with a filter expression, whose empty answer may be the
	// instances filtered out while the name stays in the catalog.
	EmptyIsAnswer bool
}

// Unit is one Kubernetes Service fed by one Consul service.
type Unit struct {
	Namespace, Name string
	ConsulName      string
	Mirror          bool   // fleetsync owns the Service too
	PortName        string // the slices' port name (import mode: the Service's)
	// CatalogDecides: an empty health answer changes nothing, the
	// catalog decides: the unit's Consul name is still listed (the answer
	// that drops it is on its way), or the supervisor's deletion guard
	// holds the unit (its name is missing from a catalog answer that
	// dropped most units).
	CatalogDecides bool
}

// Keep reports why e is left out ("" to keep it).
func (c Config) Keep(e watch.Entry) string {
	switch {
	case e.Kind != "":
		return "kind " + e.Kind
	case c.ExcludeTag != "" && slices.Contains(e.Tags, c.ExcludeTag):
		return "tag " + c.ExcludeTag
	case c.Cluster.OwnsNode(consul.Node{Name: e.Node.Name, Address: e.Node.Address, Meta: e.Node.Meta}) == nil:
		return "this cluster's own instance"
	case e.Meta[ownership.MetaExternalSource] == ownership.ExternalSource && !slices.Contains(c.IncludeClusters, e.Meta[ownership.MetaCluster]):
		return "another Kubernetes cluster's instance"
	}
	return ""
}

// conditions maps an aggregate status; ok false drops the instance.
func (c Config) conditions(status string) (discoveryv1.EndpointConditions, bool) {
	t, f := true, false
	ready := discoveryv1.EndpointConditions{Ready: &t, Serving: &t, Terminating: &f}
	notReady := discoveryv1.EndpointConditions{Ready: &f, Serving: &f, Terminating: &f}
	switch status {
	case watch.StatusPassing:
		return ready, true
	case watch.StatusWarning:
		switch c.Warning {
		case WarningFallback:
			return discoveryv1.EndpointConditions{Ready: &f, Serving: &t, Terminating: &t}, true
		case WarningNotReady:
			return notReady, true
		}
		return ready, true
	case watch.StatusMaintenance:
		return discoveryv1.EndpointConditions{Ready: &f, Serving: &f, Terminating: &t}, true
	default: // critical
		return notReady, c.Critical != CriticalDrop
	}
}

// endpoint is one desired endpoint before it is placed in a slice.
type endpoint struct {
	family discoveryv1.AddressType
	port   int32
	ep     discoveryv1.Endpoint
}

// group is one address family and port: the endpoints of one set of slices.
type group struct {
	family discoveryv1.AddressType
	port   int32
}

// address picks an entry's address: the tagged one, else the service's,
// else the node's.
func (c Config) address(e watch.Entry) string {
	if a := e.TaggedAddresses[c.AddressTag]; c.AddressTag != "" && a != "" {
		return a
	}
	if e.Address != "" {
		return e.Address
	}
	return e.Node.Address
}

// Endpoints returns the desired endpoints of entries, and a sorted problem
// list for the instances left out that the user may want to know of
// (hostnames, bad ports). Instances that Keep leaves out are not problems.
func (c Config) Endpoints(entries []watch.Entry) (eps []endpoint, problems []string) {
	seen := map[string]int{} // family/port/address -> index in eps
	for _, e := range entries {
		if c.Keep(e) != "" {
			continue
		}
		raw := c.address(e)
		ip, err := netip.ParseAddr(raw)
		if err != nil || ip.Zone() != "" {
			problems = append(problems, fmt.Sprintf("instance %s on node %s: address %q is not an IP (hostnames are skipped)", e.ID, e.Node.Name, raw))
			continue
		}
		if e.Port < 1 || e.Port > 65535 {
			problems = append(problems, fmt.Sprintf("instance %s on node %s: port %d is not in 1-65535", e.ID, e.Node.Name, e.Port))
			continue
		}
		cond, ok := c.conditions(e.Status)
		if !ok {
			continue
		}
		fam := discoveryv1.AddressTypeIPv4
		if ip.Unmap().Is6() {
			fam = discoveryv1.AddressTypeIPv6
		}
		addr := ip.Unmap().String()
		ep := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: cond}
		if z := e.Meta["zone"]; z != "" {
			ep.Zone = &z
		}
		key := string(fam) + "/" + strconv.Itoa(e.Port) + "/" + addr
		if i, dup := seen[key]; dup {
			if *cond.Ready && !*eps[i].ep.Conditions.Ready {
				eps[i].ep = ep // the same address twice: a ready one wins
			}
			continue
		}
		seen[key] = len(eps)
		eps = append(eps, endpoint{family: fam, port: int32(e.Port), ep: ep})
	}
	sort.Strings(problems)
	return eps, problems
}

// DesiredSlices places eps in slices of unit: an endpoint that is in one of
// actual's slices of its group stays there; new ones fill the slices with
// room, in name order, then new slices named <service>-<4|6>-<port>-<n>
// with the smallest free n. Slices left empty are not desired. owner is the
// Service the slices belong to (their ownerReference).
func (c Config) DesiredSlices(u Unit, eps []endpoint, actual []*discoveryv1.EndpointSlice, owner metav1.OwnerReference) []*discoveryv1.EndpointSlice {
	byGroup := map[group][]endpoint{}
	for _, e := range eps {
		g := group{e.family, e.port}
		byGroup[g] = append(byGroup[g], e)
	}
	groups := make([]group, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	sort.Slice(groups, func(i, j int) bool {
		if groups[i].family != groups[j].family {
			return groups[i].family < groups[j].family
		}
		return groups[i].port < groups[j].port
	})
	var out []*discoveryv1.EndpointSlice
	for _, g := range groups {
		out = append(out, c.placeGroup(u, g, byGroup[g], actual, owner)...)
	}
	return out
}

func (c Config) placeGroup(u Unit, g group, eps []endpoint, actual []*discoveryv1.EndpointSlice, owner metav1.OwnerReference) []*discoveryv1.EndpointSlice {
	prefix := fmt.Sprintf("%s-%s-%d-", u.Name, familyDigit(g.family), g.port)
	where := map[string]string{} // address -> the slice it is in
	var names []string
	for _, s := range actual {
		if s.AddressType != g.family || len(s.Name) <= len(prefix) || s.Name[:len(prefix)] != prefix {
			continue
		}
		names = append(names, s.Name)
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) > 0 {
				where[ep.Addresses[0]] = s.Name
			}
		}
	}
	sort.Strings(names)
	content := map[string][]discoveryv1.Endpoint{}
	var homeless []discoveryv1.Endpoint
	for _, e := range eps {
		if n, ok := where[e.ep.Addresses[0]]; ok && len(content[n]) < MaxEndpoints {
			content[n] = append(content[n], e.ep)
			continue
		}
		homeless = append(homeless, e.ep)
	}
	used := map[string]bool{}
	for _, n := range names {
		used[n] = true
	}
	fill := func(n string) {
		room := MaxEndpoints - len(content[n])
		take := min(room, len(homeless))
		content[n] = append(content[n], homeless[:take]...)
		homeless = homeless[take:]
	}
	for _, n := range names {
		fill(n)
	}
	for i := 0; len(homeless) > 0; i++ {
		n := prefix + strconv.Itoa(i)
		if used[n] {
			continue
		}
		used[n] = true
		names = append(names, n)
		fill(n)
	}
	var out []*discoveryv1.EndpointSlice
	for _, n := range names {
		if len(content[n]) == 0 {
			continue
		}
		sortEndpoints(content[n])
		out = append(out, c.slice(u, n, g, content[n], owner))
	}
	return out
}

func familyDigit(f discoveryv1.AddressType) string {
	if f == discoveryv1.AddressTypeIPv6 {
		return "6"
	}
	return "4"
}

func sortEndpoints(eps []discoveryv1.Endpoint) {
	sort.Slice(eps, func(i, j int) bool { return eps[i].Addresses[0] < eps[j].Addresses[0] })
}

func (c Config) slice(u Unit, name string, g group, eps []discoveryv1.Endpoint, owner metav1.OwnerReference) *discoveryv1.EndpointSlice {
	port, proto, pname := g.port, corev1.ProtocolTCP, u.PortName
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: u.Namespace, Name: name,
			Labels:          map[string]string{discoveryv1.LabelServiceName: u.Name},
			OwnerReferences: []metav1.OwnerReference{owner}},
		AddressType: g.family,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	c.Mark.Stamp(s)
	return s
}

// OwnerOf is the ownerReference of slices to svc.
func OwnerOf(name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Service", Name: name, UID: uid}
}

// DesiredService is the mirrored Service of u with endpoints eps (nil when
// there are none: a name with no instance to mirror has no Service).
func (c Config) DesiredService(u Unit, eps []endpoint) *corev1.Service {
	if len(eps) == 0 {
		return nil
	}
	port := eps[0].port
	for _, e := range eps {
		port = min(port, e.port)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: u.Namespace, Name: u.Name,
			Annotations: map[string]string{AnnotationConsulService: u.ConsulName}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{
			Name: PortName, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromString(PortName)}}},
	}
	c.shape(u, svc)
	c.Mark.Stamp(svc)
	return svc
}
