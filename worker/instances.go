package worker

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// AnnotationWeight is consul-k8s's service-weight annotation: an integer
// above 1 becomes Weights.Passing of LoadBalancer-ingress and externalIPs
// instances.
const AnnotationWeight = ConsulPrefix + "service-weight"

// consul-k8s's meta keys (--consul-k8s-meta).
const (
	MetaK8sNS      = "external-k8s-ns"
	MetaK8sRefKind = "external-k8s-ref-kind"
	MetaK8sRefName = "external-k8s-ref-name"
	MetaK8sNode    = "external-k8s-node-name"
	MetaK8sZone    = "external-k8s-topology-zone"
	MetaK8sPort    = "port-" // + spec.ports[].name
)

// Check outputs of instances that stand for the whole Service (externalIPs,
// LoadBalancer ingress, Ingress hosts) or for one node (NodePort).
const (
	OutputServiceReady       = "Kubernetes Service has a ready endpoint"
	OutputServiceTerminating = "Kubernetes Service has only terminating endpoints"
	OutputServiceNotReady    = "Kubernetes Service has no ready endpoint"
	OutputNodeReady          = "Kubernetes Service has a ready endpoint on this node"
	OutputNodeTerminating    = "Kubernetes Service has only terminating endpoints on this node"
	OutputNodeNotReady       = "Kubernetes Service has no ready endpoint on this node"
)

// kind says what the instances of a Service stand for.
type kind int

const (
	kindEndpoints    kind = iota // one per endpoint: pod IP, target port
	kindExternalIPs              // one per spec.externalIPs entry
	kindLoadBalancer             // one per status.loadBalancer.ingress entry
	kindNodePort                 // one per node with endpoints: node address, NodePort
	kindIngress                  // one per Ingress route: host (or Ingress LB IP), 80/443
)

// kindOf picks the instances of svc as consul-k8s does: externalIPs first,
// whatever the type; then the type; an Ingress route replaces the endpoints
// of a ClusterIP Service (or a LoadBalancer one synced by endpoints).
func kindOf(svc *k8s.Service, cfg Config) kind {
	switch {
	case len(svc.ExternalIPs) > 0:
		return kindExternalIPs
	case svc.Type == corev1.ServiceTypeLoadBalancer && !cfg.SyncLoadBalancerEndpoints:
		return kindLoadBalancer
	case svc.Type == corev1.ServiceTypeNodePort:
		return kindNodePort
	case cfg.EnableIngress && len(svc.Endpoints) > 0 && len(ingressAddresses(svc, cfg)) > 0:
		return kindIngress
	}
	return kindEndpoints
}

// base is what every instance of one Service shares.
type base struct {
	name string
	tags []string          // stamped (ownership.Cluster.StampTags)
	meta map[string]string // user meta
	port PortChoice
}

// builder collects the instances of one Service and the problems met.
type builder struct {
	svc      *k8s.Service
	cfg      Config
	b        base
	out      []consul.Instance
	problems []string // input the instances could not use (Spec.Skipped)
	warnings []string // Spec.Warnings
}

func (bd *builder) problem(format string, args ...any) {
	bd.problems = append(bd.problems, fmt.Sprintf("service %s: ", bd.svc.Key)+fmt.Sprintf(format, args...))
}

// add appends an instance with meta, a map built for it alone, which
// add stamps in place, and its own copy of the Service's stamped tags
// (instances share nothing: TestDesiredInstancesShareNothing).
func (bd *builder) add(address string, port int, weight int, meta map[string]string, check consul.Check) {
	if meta == nil {
		meta = make(map[string]string, 2)
	}
	bd.cfg.Cluster.StampMeta(meta)
	bd.out = append(bd.out, consul.Instance{
		ID:      bd.cfg.Cluster.InstanceID(bd.svc.Namespace, bd.svc.Name, address, port),
		Name:    bd.b.name,
		Address: address,
		Port:    port,
		Weight:  weight,
		Tags:    slices.Clone(bd.b.tags),
		Meta:    meta,
		Check:   check,
	})
}

// servicePort is the port consul-k8s gives instances that are not
// endpoints: the service-port number; else the named spec port (its
// NodePort on a NodePort Service); else the first NodePort of a NodePort
// Service, or the first port.
func servicePort(svc *k8s.Service, pc PortChoice) int {
	nodePort := svc.Type == corev1.ServiceTypeNodePort
	if pc.Number != 0 {
		return pc.Number
	}
	for _, p := range svc.Ports {
		if pc.Name != "" && p.Name == pc.Name {
			if nodePort && p.NodePort > 0 {
				return int(p.NodePort)
			}
			return int(p.Port)
		}
	}
	if nodePort {
		for _, p := range svc.Ports {
			if p.NodePort > 0 {
				return int(p.NodePort)
			}
		}
	}
	if len(svc.Ports) > 0 {
		return int(svc.Ports[0].Port)
	}
	return 0
}

// weight parses the service-weight annotation; 0 means Consul's default.
func weight(svc *k8s.Service) (int, error) {
	v, ok := svc.Annotations[AnnotationWeight]
	if !ok || strings.TrimSpace(v) == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 1 {
		return 0, annotationError(svc.Key.String(), AnnotationWeight, v, "must be an integer greater than 1; Consul's default weight is used")
	}
	return n, nil
}

// serviceCheck is the check of an instance that stands for the whole
// Service (or, nodeLevel, for the endpoints on one node): passing when an
// endpoint is ready, else the terminating policy's status when one is
// serving and terminating, else critical.
func serviceCheck(eps []k8s.Endpoint, cfg Config, nodeLevel bool) consul.Check {
	ready, terminating := OutputServiceReady, OutputServiceTerminating
	notReady := OutputServiceNotReady
	if nodeLevel {
		ready, terminating, notReady = OutputNodeReady, OutputNodeTerminating, OutputNodeNotReady
	}
	draining := false
	for _, ep := range eps {
		if ep.Ready {
			return consul.Check{Status: consul.StatusPassing, Output: ready}
		}
		draining = draining || (ep.Serving && ep.Terminating)
	}
	if draining && cfg.Terminating != TerminatingCritical && cfg.Terminating != TerminatingDrop {
		return consul.Check{Status: consul.StatusWarning, Output: terminating}
	}
	if draining {
		return consul.Check{Status: consul.StatusCritical, Output: terminating}
	}
	return consul.Check{Status: consul.StatusCritical, Output: notReady}
}

// serviceMeta is the meta of an instance that stands for the Service.
func (bd *builder) serviceMeta() map[string]string {
	m := instanceMeta(bd.svc, k8s.Endpoint{}, bd.b.meta)
	bd.consulK8sMeta(m, k8s.Endpoint{})
	return m
}

// consulK8sMeta adds consul-k8s's keys to m when --consul-k8s-meta is on:
// external-k8s-ns and port-<name> always, the endpoint's reference, node
// and zone when ep has them.
func (bd *builder) consulK8sMeta(m map[string]string, ep k8s.Endpoint) {
	if !bd.cfg.ConsulK8sMeta {
		return
	}
	m[MetaK8sNS] = bd.svc.Namespace
	for _, p := range bd.svc.Ports {
		m[MetaK8sPort+p.Name] = strconv.Itoa(int(p.Port))
	}
	if ep.Pod != "" {
		m[MetaK8sRefKind] = "Pod"
		m[MetaK8sRefName] = ep.Pod
	}
	setIf(m, MetaK8sNode, ep.Node)
	setIf(m, MetaK8sZone, ep.Zone)
}

func (bd *builder) externalIPs(w int) {
	port := servicePort(bd.svc, bd.b.port)
	check := serviceCheck(bd.svc.Endpoints, bd.cfg, false)
	seen := map[string]bool{}
	for i, raw := range bd.svc.ExternalIPs {
		addr, err := netip.ParseAddr(strings.TrimSpace(raw))
		if err != nil || addr.Zone() != "" {
			bd.problem("spec.externalIPs[%d] %q: not an IP address, skipped", i, raw)
			continue
		}
		if s := addr.String(); !seen[s] {
			seen[s] = true
			bd.add(s, port, w, bd.serviceMeta(), check)
		}
	}
}

func (bd *builder) loadBalancer(w int) {
	port := servicePort(bd.svc, bd.b.port)
	check := serviceCheck(bd.svc.Endpoints, bd.cfg, false)
	seen := map[string]bool{}
	for i, lb := range bd.svc.LoadBalancer {
		var address string
		switch {
		case lb.IP != "":
			addr, err := netip.ParseAddr(lb.IP)
			if err != nil || addr.Zone() != "" {
				bd.problem("status.loadBalancer.ingress[%d].ip %q: not an IP address, skipped", i, lb.IP)
				continue
			}
			address = addr.String()
		case lb.Hostname != "":
			if errs := validation.IsDNS1123Subdomain(lb.Hostname); len(errs) > 0 {
				bd.problem("status.loadBalancer.ingress[%d].hostname %q: not a valid DNS name (%s), skipped", i, lb.Hostname, errs[0])
				continue
			}
			address = lb.Hostname
		default:
			continue
		}
		if !seen[address] {
			seen[address] = true
			bd.add(address, port, w, bd.serviceMeta(), check)
		}
	}
}

// ingressAddress is one Ingress route as an instance address and port.
type ingressAddress struct {
	address string
	port    int
}

// ingressAddresses returns the distinct (address, port) of svc's Ingress
// routes: the rule's host, or with --loadbalancer-ips the Ingress's first
// load balancer IP (a route without one is not used); port 443 when the
// host is under spec.tls, else 80.
func ingressAddresses(svc *k8s.Service, cfg Config) []ingressAddress {
	var out []ingressAddress
	for _, r := range svc.Ingresses {
		a := ingressAddress{address: r.Host, port: 80}
		if cfg.IngressLoadBalancerIPs {
			a.address = r.LoadBalancerIP
		}
		if r.TLS {
			a.port = 443
		}
		if a.address == "" {
			continue
		}
		dup := false
		for _, o := range out {
			dup = dup || o == a
		}
		if !dup {
			out = append(out, a)
		}
	}
	return out
}

func (bd *builder) ingress() {
	check := serviceCheck(bd.svc.Endpoints, bd.cfg, false)
	for _, a := range ingressAddresses(bd.svc, bd.cfg) {
		bd.add(a.address, a.port, 0, bd.serviceMeta(), check)
	}
}

// endpoints registers one instance per endpoint (pod IP, target port).
func (bd *builder) endpoints() {
	for _, ep := range bd.svc.Endpoints {
		status, output, ok := endpointCheck(ep, bd.cfg)
		if !ok {
			continue
		}
		p, ok := endpointPort(ep, bd.b.port)
		if !ok {
			bd.warnings = append(bd.warnings, fmt.Sprintf("service %s: endpoint %s has no port %q, skipped", bd.svc.Key, ep.Address, bd.b.port.Name))
			continue
		}
		m := instanceMeta(bd.svc, ep, bd.b.meta)
		bd.consulK8sMeta(m, ep)
		bd.add(ep.Address, p, 0, m, consul.Check{Status: status, Output: output})
	}
}
