package worker

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
)

// Per-instance meta keys (the mark's keys are added by ownership.Stamp).
const (
	MetaNamespace = "k8s-namespace"
	MetaService   = "k8s-service"
	MetaPod       = "k8s-pod"
	MetaNode      = "k8s-node"
	MetaZone      = "k8s-zone"
)

var reservedMeta = map[string]bool{
	ownership.MetaExternalSource: true, ownership.MetaCluster: true,
	MetaNamespace: true, MetaService: true, MetaPod: true, MetaNode: true, MetaZone: true,
}

// TerminatingPolicy says what to do with endpoints that are serving and
// terminating (draining).
type TerminatingPolicy string

// Terminating policies.
const (
	TerminatingWarning  TerminatingPolicy = "warning"
	TerminatingCritical TerminatingPolicy = "critical"
	TerminatingDrop     TerminatingPolicy = "drop"
)

// Config is what desired-state computation needs besides the Service.
type Config struct {
	Cluster            ownership.Cluster
	DefaultWindow      time.Duration
	ServicePrefix      string // prepended to the Kubernetes name (not to service-name)
	AddNamespaceSuffix bool   // append -<namespace> to the Kubernetes name
	K8sTag             string // tag added to every instance ("" for none)
	Terminating        TerminatingPolicy
	RegisterNotReady   bool // register not-ready endpoints with a critical check
	// ReservedTag reports whether tag is the ownership tag (the cluster id)
	// of another cluster in the same Consul, and which. Such a user tag is
	// dropped with a warning: <other>.<name>.service.consul must resolve
	// only the other cluster's instances. Desired passes the tag lowercased
	// (Consul matches tags case-insensitively; cluster ids are lowercase).
	// It must be safe for concurrent use. nil: nothing is reserved.
	ReservedTag func(tag string) (cluster string, reserved bool)

	// What each Service type registers, as consul-k8s's flags.
	NodePortSync              NodePortSyncType // "" means ExternalFirst
	SyncLoadBalancerEndpoints bool             // LoadBalancer: endpoints instead of status.loadBalancer.ingress
	EnableIngress             bool             // an Ingress "/" rule's host replaces the endpoints
	IngressLoadBalancerIPs    bool             // with EnableIngress: the Ingress's LB IP instead of the host
	ConsulK8sMeta             bool             // also write consul-k8s's external-k8s-* and port-<name> meta
	// StrictAnnotations refuses a service name Consul DNS cannot look up
	// and a service-port name the Service lacks, instead of warning.
	StrictAnnotations bool
}

// Spec is the desired state of one Service in Consul.
type Spec struct {
	Name      string
	Window    time.Duration
	Instances []consul.Instance // stamped, sorted by ID, unique IDs
	Warnings  []string          // non-fatal problems (bad window, skipped endpoints)
	// Skipped names each part of the Service's spec, status or Nodes that
	// gave no instance (a bad external IP or LB hostname, a node without
	// the address asked for), with the Service and the field.
	Skipped []string
}

// Check outputs, fixed so that unchanged endpoints produce unchanged checks.
const (
	OutputReady       = "Kubernetes endpoint is ready"
	OutputTerminating = "Kubernetes endpoint is terminating"
	OutputNotReady    = "Kubernetes endpoint is not ready"
)

// Desired computes the Spec of svc. An error (an *AnnotationError) means the
// Service cannot be synced as it is; nothing should be written for it.
func Desired(svc *k8s.Service, cfg Config) (Spec, error) {
	key := svc.Key.String()
	spec := Spec{Window: cfg.DefaultWindow}
	if v, ok := svc.Annotations[AnnotationWindow]; ok {
		if d, err := ParseWindow(v); err != nil {
			spec.Warnings = append(spec.Warnings, annotationError(key, AnnotationWindow, v, err.Error()+"; using the default "+cfg.DefaultWindow.String()).Error())
		} else {
			spec.Window = d
		}
	}
	if v, ok := svc.Annotations[AnnotationSync]; ok {
		if _, err := strconv.ParseBool(strings.TrimSpace(v)); err != nil {
			return spec, annotationError(key, AnnotationSync, v, `must be "true" or "false"`)
		}
	}
	name, warning, err := serviceName(svc, cfg)
	if err != nil {
		return spec, err
	}
	spec.Name = name
	spec.Warnings = appendNonEmpty(spec.Warnings, warning)
	tags, dropped, err := userTags(svc, cfg, name)
	if err != nil {
		return spec, err
	}
	spec.Warnings = append(spec.Warnings, dropped...)
	meta, err := userMeta(svc)
	if err != nil {
		return spec, err
	}
	port, warning, err := portChoice(svc, cfg)
	if err != nil {
		return spec, err
	}
	spec.Warnings = appendNonEmpty(spec.Warnings, warning)
	bd := &builder{svc: svc, cfg: cfg, b: base{name: name, tags: cfg.Cluster.StampTags(tags), meta: meta, port: port}}
	switch kindOf(svc, cfg) {
	case kindExternalIPs, kindLoadBalancer:
		w, err := weight(svc)
		if err != nil {
			spec.Warnings = append(spec.Warnings, err.Error())
		}
		if len(svc.ExternalIPs) > 0 {
			bd.externalIPs(w)
		} else {
			bd.loadBalancer(w)
		}
	case kindNodePort:
		bd.nodePort()
	case kindIngress:
		bd.ingress()
	default:
		bd.endpoints()
	}
	spec.Instances = bd.out
	spec.Warnings = append(spec.Warnings, bd.warnings...)
	spec.Skipped = bd.problems
	for _, in := range spec.Instances {
		if len(in.Meta) > maxMetaPairs {
			return spec, &AnnotationError{Service: key, Annotation: AnnotationMeta + "*", Value: fmt.Sprintf("%d keys", len(in.Meta)),
				Reason: fmt.Sprintf("an instance would have %d meta keys, Consul allows %d (--consul-k8s-meta adds one per spec.ports entry)", len(in.Meta), maxMetaPairs)}
		}
	}
	sort.Slice(spec.Instances, func(i, j int) bool { return spec.Instances[i].ID < spec.Instances[j].ID })
	spec.Instances = dedupe(spec.Instances)
	return spec, nil
}

// userTags returns the --k8s-tag and service-tags tags of Consul service
// name, and a warning for each one left out because it is another
// cluster's ownership tag.
func userTags(svc *k8s.Service, cfg Config, name string) (tags, warnings []string, err error) {
	key := svc.Key.String()
	if cfg.K8sTag != "" {
		if cluster, ok := reservedTag(cfg, cfg.K8sTag); ok {
			warnings = append(warnings, fmt.Sprintf("service %s: --k8s-tag %s", key, reservedReason(cfg.K8sTag, cluster, name)))
		} else {
			tags = append(tags, cfg.K8sTag)
		}
	}
	if v, ok := svc.Annotations[AnnotationTags]; ok {
		parsed, err := ParseTags(v)
		if err != nil {
			return nil, nil, annotationError(key, AnnotationTags, v, err.Error())
		}
		for _, t := range parsed {
			if cluster, ok := reservedTag(cfg, t); ok {
				warnings = append(warnings, annotationError(key, AnnotationTags, v, "tag "+reservedReason(t, cluster, name)).Error())
				continue
			}
			if !slices.Contains(tags, t) {
				tags = append(tags, t)
			}
		}
	}
	return tags, warnings, nil
}

// reservedTag reports whether tag is the ownership tag of a cluster other
// than cfg's, as Consul compares tags (ignoring case).
func reservedTag(cfg Config, tag string) (string, bool) {
	if cfg.ReservedTag == nil {
		return "", false
	}
	cluster, ok := cfg.ReservedTag(strings.ToLower(tag))
	return cluster, ok && cluster != cfg.Cluster.ID()
}

func reservedReason(tag, cluster, name string) string {
	return fmt.Sprintf("%q is the ownership tag of cluster %s in this Consul, so %s.%s.service.consul would also return this cluster's instances: left out",
		tag, cluster, cluster, name)
}

func userMeta(svc *k8s.Service) (map[string]string, error) {
	meta := map[string]string{}
	keys := make([]string, 0)
	for k := range svc.Annotations {
		if strings.HasPrefix(k, AnnotationMeta) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		mk, v := strings.TrimPrefix(k, AnnotationMeta), svc.Annotations[k]
		if err := ValidateMeta(mk, v, reservedMeta); err != nil {
			return nil, annotationError(svc.Key.String(), k, v, err.Error())
		}
		meta[mk] = v
	}
	if len(meta)+len(reservedMeta) > maxMetaPairs {
		return nil, annotationError(svc.Key.String(), AnnotationMeta+"*", fmt.Sprintf("%d keys", len(meta)),
			fmt.Sprintf("at most %d user meta keys allowed (Consul allows %d, fleetsync uses %d)", maxMetaPairs-len(reservedMeta), maxMetaPairs, len(reservedMeta)))
	}
	return meta, nil
}

func endpointPort(ep k8s.Endpoint, pc PortChoice) (int, bool) {
	if pc.Number != 0 {
		return pc.Number, true
	}
	p, ok := ep.Ports[pc.Name]
	return int(p), ok && p > 0
}

func endpointCheck(ep k8s.Endpoint, cfg Config) (status, output string, ok bool) {
	switch {
	case ep.Ready:
		return consul.StatusPassing, OutputReady, true
	case ep.Serving && ep.Terminating:
		switch cfg.Terminating {
		case TerminatingDrop:
			return "", "", false
		case TerminatingCritical:
			return consul.StatusCritical, OutputTerminating, true
		default:
			return consul.StatusWarning, OutputTerminating, true
		}
	case cfg.RegisterNotReady:
		return consul.StatusCritical, OutputNotReady, true
	}
	return "", "", false
}

func instanceMeta(svc *k8s.Service, ep k8s.Endpoint, user map[string]string) map[string]string {
	m := make(map[string]string, len(user)+7)
	for k, v := range user {
		m[k] = v
	}
	m[MetaNamespace] = svc.Namespace
	m[MetaService] = svc.Name
	setIf(m, MetaPod, ep.Pod)
	setIf(m, MetaNode, ep.Node)
	setIf(m, MetaZone, ep.Zone)
	return m
}

func setIf(m map[string]string, k, v string) {
	if v != "" {
		m[k] = v
	}
}

func dedupe(in []consul.Instance) []consul.Instance {
	out := in[:0]
	for i, x := range in {
		if i > 0 && x.ID == in[i-1].ID {
			continue
		}
		out = append(out, x)
	}
	return out
}

// IsAnnotationError reports whether err is an *AnnotationError.
func IsAnnotationError(err error) bool {
	var ae *AnnotationError
	return errors.As(err, &ae)
}
