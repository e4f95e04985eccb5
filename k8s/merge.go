package k8s

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// reporter records one input problem; the caller prefixes where it was found.
type reporter func(format string, args ...any)

// merger folds the endpoints of every slice of one Service into one
// endpoint per address.
type merger struct {
	endpoints []Endpoint
	index     map[string]int // Address -> position in endpoints
	problems  []string
}

// mergeSlices merges the endpoints of all slices of one Service. It sorts
// slices by name in place, so that "first known" is deterministic. The
// result is sorted by Address, the problems are sorted; both are nil when
// empty.
func mergeSlices(slices []*cachedSlice) ([]Endpoint, []string) {
	sortByName(slices)
	m := &merger{index: make(map[string]int)}
	for _, s := range slices {
		m.addSlice(s)
	}
	return m.result()
}

func (m *merger) addSlice(s *cachedSlice) {
	report := func(format string, args ...any) {
		m.problems = append(m.problems, fmt.Sprintf("EndpointSlice %s/%s: ", s.Namespace, s.Name)+fmt.Sprintf(format, args...))
	}
	if s.addressType != discoveryv1.AddressTypeIPv4 && s.addressType != discoveryv1.AddressTypeIPv6 {
		report("addressType %s is not supported, ignored", s.addressType)
		return
	}
	ports := slicePorts(s.ports, report)
	for i := range s.endpoints {
		m.addEndpoint(&s.endpoints[i], i, s.addressType, ports, report)
	}
}

// addEndpoint adds every address of one slice endpoint.
func (m *merger) addEndpoint(ep *cachedEndpoint, i int, family discoveryv1.AddressType, ports map[string]int32, report reporter) {
	if len(ep.addresses) == 0 {
		report("endpoints[%d]: no addresses, ignored", i)
		return
	}
	base := endpointOf(ep, i, report)
	for j, raw := range ep.addresses {
		reportAt := func(format string, args ...any) {
			report("endpoints[%d].addresses[%d] %q: %s", i, j, raw, fmt.Sprintf(format, args...))
		}
		address, err := parseAddress(raw, family)
		if err != nil {
			reportAt("%v", err)
			continue
		}
		e := base
		e.Address = address
		m.add(e, ports, reportAt)
	}
}

// add stores e with ports, the map of its slice (shared, never written),
// or merges it into the endpoint already seen at the same address.
func (m *merger) add(e Endpoint, ports map[string]int32, report reporter) {
	pos, seen := m.index[e.Address]
	if !seen {
		e.Ports = ports
		m.index[e.Address] = len(m.endpoints)
		m.endpoints = append(m.endpoints, e)
		return
	}
	m.endpoints[pos].absorb(e, ports, report)
}

// absorb merges another copy of the same address: ports are united (the
// first number seen for a name wins; e's map is copied before it changes,
// as its slice's other endpoints share it), Ready and Serving are ORed,
// Terminating is ANDed, and empty Pod, Node and Zone are filled in.
func (e *Endpoint) absorb(other Endpoint, ports map[string]int32, report reporter) {
	copied := false
	for name, port := range ports {
		have, ok := e.Ports[name]
		switch {
		case !ok:
			if !copied {
				e.Ports, copied = maps.Clone(e.Ports), true
			}
			e.Ports[name] = port
		case have != port:
			report("port %q is %d here but %d in an earlier copy of the address, kept %d", name, port, have, have)
		}
	}
	e.Ready = e.Ready || other.Ready
	e.Serving = e.Serving || other.Serving
	e.Terminating = e.Terminating && other.Terminating
	e.Pod = cmp.Or(e.Pod, other.Pod)
	e.Node = cmp.Or(e.Node, other.Node)
	e.Zone = cmp.Or(e.Zone, other.Zone)
}

func (m *merger) result() ([]Endpoint, []string) {
	slices.SortFunc(m.endpoints, func(a, b Endpoint) int { return cmp.Compare(a.Address, b.Address) })
	slices.Sort(m.problems)
	return m.endpoints, m.problems
}

// endpointOf returns the conditions and location of ep (endpoints[i] of its
// slice), without address or ports. A location field Consul cannot store
// as a meta value is left out with a problem; the endpoint stays.
func endpointOf(ep *cachedEndpoint, i int, report reporter) Endpoint {
	return Endpoint{
		Ready:       ep.ready,
		Serving:     ep.serving,
		Terminating: ep.terminating,
		Pod:         metaValue(ep.pod, i, "targetRef.name", report),
		Node:        metaValue(ep.node, i, "nodeName", report),
		Zone:        metaValue(ep.zone, i, "zone", report),
	}
}

// MaxMetaValueLen is Consul's limit on a service meta value, in bytes.
// Endpoint.Pod, Node and Zone become meta values (k8s-pod, k8s-node,
// k8s-zone), and Kubernetes does not validate them in a hand-made
// EndpointSlice: one over the limit would make Consul refuse every write
// of the Service.
const MaxMetaValueLen = 512

// metaValue returns v when Consul can store it as a service meta value as
// it is, else "" and a problem naming field of endpoints[i]. Invalid UTF-8
// is left out too: Consul's JSON would store it altered, so the read-back
// would never equal the desired value and every anti-entropy pass would
// write it again.
func metaValue(v string, i int, field string, report reporter) string {
	switch {
	case len(v) > MaxMetaValueLen:
		report("endpoints[%d].%s: %d bytes, over Consul's %d for a meta value: left out", i, field, len(v), MaxMetaValueLen)
		return ""
	case !utf8.ValidString(v):
		report("endpoints[%d].%s: not valid UTF-8, which Consul cannot store as it is: left out", i, field)
		return ""
	}
	return v
}

// slicePorts maps port name to number for one slice. A port without a
// number is skipped with a problem, except the "all ports" form: a single
// unnamed port with no number, which leaves the endpoints without ports.
func slicePorts(ports []discoveryv1.EndpointPort, report reporter) map[string]int32 {
	out := make(map[string]int32, len(ports))
	for i, p := range ports {
		name := ptr.Deref(p.Name, "")
		_, duplicate := out[name]
		switch {
		case p.Port == nil && isAllPorts(ports):
		case p.Port == nil:
			report("ports[%d] %q: port is nil, skipped", i, name)
		case *p.Port < 1 || *p.Port > 65535:
			report("ports[%d] %q: port %d is out of range, skipped", i, name, *p.Port)
		case duplicate:
			report("ports[%d] %q: duplicate port name, skipped", i, name)
		default:
			out[name] = *p.Port
		}
	}
	return out
}

func isAllPorts(ports []discoveryv1.EndpointPort) bool {
	return len(ports) == 1 && ports[0].Port == nil && ptr.Deref(ports[0].Name, "") == ""
}

func sortByName(s []*cachedSlice) {
	slices.SortFunc(s, func(a, b *cachedSlice) int { return cmp.Compare(a.Name, b.Name) })
}
