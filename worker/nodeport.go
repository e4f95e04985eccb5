package worker

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/k8s"
)

// NodePortSyncType says which node address a NodePort instance gets, as
// consul-k8s's -node-port-sync-type.
type NodePortSyncType string

// Node address choices.
const (
	ExternalFirst NodePortSyncType = "ExternalFirst" // ExternalIP, else InternalIP
	ExternalOnly  NodePortSyncType = "ExternalOnly"  // ExternalIP, else not registered
	InternalOnly  NodePortSyncType = "InternalOnly"  // InternalIP, else not registered
)

// nodePort registers one instance per node that has endpoints of the
// Service (consul-k8s registers one per endpoint, so a node with three
// pods is in Consul three times under the same address and port).
func (bd *builder) nodePort() {
	port := servicePort(bd.svc, bd.b.port)
	byNode := map[string][]k8s.Endpoint{}
	var order []string
	for _, ep := range bd.svc.Endpoints {
		if ep.Node == "" {
			bd.problem("endpoint %s has no nodeName: a NodePort instance needs its node's address, skipped", ep.Address)
			continue
		}
		if _, ok := byNode[ep.Node]; !ok {
			order = append(order, ep.Node)
		}
		byNode[ep.Node] = append(byNode[ep.Node], ep)
	}
	for _, node := range order {
		eps := byNode[node]
		if !bd.registered(eps) {
			continue
		}
		addrs, known := bd.svc.Nodes[node]
		if !known {
			bd.problem("node %s of endpoint %s is not known (no such Node), skipped", node, eps[0].Address)
			continue
		}
		address, ok := nodeAddress(addrs, bd.cfg.NodePortSync)
		if !ok {
			bd.problem("node %s has no %s in status.addresses (--node-port-sync-type=%s), skipped", node, wantedAddress(bd.cfg.NodePortSync), syncTypeOrDefault(bd.cfg.NodePortSync))
			continue
		}
		ip, err := netip.ParseAddr(address)
		if err != nil || ip.Zone() != "" {
			bd.problem("node %s: status.addresses %q: not an IP address, skipped", node, address)
			continue
		}
		address = ip.String()
		m := instanceMeta(bd.svc, k8s.Endpoint{Node: node, Zone: eps[0].Zone}, bd.b.meta)
		bd.consulK8sMeta(m, k8s.Endpoint{Pod: eps[0].Pod, Node: node, Zone: eps[0].Zone})
		bd.add(address, port, 0, m, serviceCheck(eps, bd.cfg, true))
	}
}

// registered reports whether a node's endpoints put it in Consul: consul-k8s
// registers a node for any endpoint on it, ready or not; fleetsync does
// too, except that serving+terminating endpoints under --terminating=drop
// and not-ready ones (without --register-not-ready) alone are not enough.
func (bd *builder) registered(eps []k8s.Endpoint) bool {
	for _, ep := range eps {
		if _, _, ok := endpointCheck(ep, bd.cfg); ok {
			return true
		}
	}
	return false
}

func syncTypeOrDefault(t NodePortSyncType) NodePortSyncType {
	if t == "" {
		return ExternalFirst
	}
	return t
}

func wantedAddress(t NodePortSyncType) string {
	switch syncTypeOrDefault(t) {
	case ExternalOnly:
		return "ExternalIP"
	case InternalOnly:
		return "InternalIP"
	}
	return "ExternalIP or InternalIP"
}

// nodeAddress picks the first address of the wanted type, as consul-k8s
// (the first is the primary interface).
func nodeAddress(addrs []k8s.NodeAddress, t NodePortSyncType) (string, bool) {
	first := func(typ corev1.NodeAddressType) (string, bool) {
		for _, a := range addrs {
			if a.Type == typ && a.Address != "" {
				return a.Address, true
			}
		}
		return "", false
	}
	switch syncTypeOrDefault(t) {
	case InternalOnly:
		return first(corev1.NodeInternalIP)
	case ExternalOnly:
		return first(corev1.NodeExternalIP)
	}
	if a, ok := first(corev1.NodeExternalIP); ok {
		return a, true
	}
	return first(corev1.NodeInternalIP)
}
