package main

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/worker"
)

// consul-k8s's catalog sync, as control-plane/catalog/to-consul/resource.go
// writes it: the namespace meta key and its check's name.
const (
	consulK8sNSMeta    = "external-k8s-ns"
	consulK8sCheckName = "Kubernetes Readiness Check"
)

// Preflight verdicts, one per Service.
const (
	verdictSame       = "same"       // the same addresses and ports
	verdictChanges    = "changes"    // the same addresses and ports; names, tags, meta or the check differ
	verdictDisappears = "disappears" // consul-k8s registers something fleetsync would not
	verdictNew        = "new"        // fleetsync registers what consul-k8s does not
)

// preflightService is what `fleetsync preflight` says of one Service.
type preflightService struct {
	Namespace   string   `json:"namespace"`
	Service     string   `json:"service,omitempty"` // the Kubernetes Service; "" when none matches
	Name        string   `json:"consul_name"`       // in Consul: consul-k8s's name, else fleetsync's
	Verdict     string   `json:"verdict"`
	ConsulK8s   []string `json:"consul_k8s_instances"` // address:port
	Fleetsync   []string `json:"fleetsync_instances"`
	Missing     []string `json:"missing,omitempty"` // in consul-k8s's, not in fleetsync's
	Differences []string `json:"differences,omitempty"`
	Reason      string   `json:"reason,omitempty"` // why fleetsync would not register it
}

// preflightReport is the whole comparison.
type preflightReport struct {
	ClusterID     string             `json:"cluster_id"`
	ConsulK8sNode string             `json:"consul_k8s_node"`
	Services      []preflightService `json:"services"`
	Settings      []string           `json:"settings,omitempty"` // defaults that differ, with what to set
	Disappearing  int                `json:"disappearing"`       // Services with instances that would disappear
}

// preflightInput is one Kubernetes Service as fleetsync would see it.
type preflightInput struct {
	svc      *k8s.Service
	selected bool
	spec     worker.Spec
	err      error // from worker.Desired
}

// comparePreflight compares consul-k8s's entries with what fleetsync would
// register for the Services in (a pure function of both).
func comparePreflight(cfg config, sel supervisor.Selector, in []preflightInput, entries []conn.ForeignEntry, node string) preflightReport {
	rep := preflightReport{ClusterID: cfg.ClusterID, ConsulK8sNode: node}
	type group struct {
		ns, name string
		entries  []conn.ForeignEntry
	}
	groups := map[string]*group{}
	for _, e := range entries {
		ns := e.Meta[consulK8sNSMeta]
		k := ns + "/" + e.Service
		if groups[k] == nil {
			groups[k] = &group{ns: ns, name: e.Service}
		}
		groups[k].entries = append(groups[k].entries, e)
	}
	ours := map[string]preflightInput{}
	for _, x := range in {
		if x.selected && x.err == nil && len(x.spec.Instances) > 0 {
			ours[x.svc.Namespace+"/"+x.spec.Name] = x
		}
	}
	notes := map[string]bool{}
	for _, k := range sortedKeys(groups) {
		g := groups[k]
		ps := preflightService{Namespace: g.ns, Name: g.name, ConsulK8s: consulK8sAddrs(g.entries)}
		if x, ok := ours[k]; ok {
			delete(ours, k)
			ps.Service, ps.Fleetsync = x.svc.Name, instanceAddrs(x.spec.Instances)
			ps.Missing = minus(ps.ConsulK8s, ps.Fleetsync)
			ps.Differences = differences(g.entries[0], x.spec.Instances[0], cfg)
			switch {
			case len(ps.Missing) > 0:
				ps.Verdict = verdictDisappears
			case len(ps.Differences) > 0 || len(minus(ps.Fleetsync, ps.ConsulK8s)) > 0:
				ps.Verdict = verdictChanges
			default:
				ps.Verdict = verdictSame
			}
			if _, annotated := x.svc.Annotations[worker.AnnotationSync]; !annotated && cfg.DefaultSync {
				notes["default-sync"] = true
			}
		} else {
			ps.Verdict, ps.Missing = verdictDisappears, ps.ConsulK8s
			ps.Service, ps.Reason = whyNot(g.ns, g.name, in, sel, cfg, notes)
		}
		if ps.Verdict == verdictDisappears {
			rep.Disappearing++
		}
		rep.Services = append(rep.Services, ps)
	}
	for _, k := range sortedKeys(ours) {
		x := ours[k]
		rep.Services = append(rep.Services, preflightService{Namespace: x.svc.Namespace, Service: x.svc.Name, Name: x.spec.Name,
			Verdict: verdictNew, Fleetsync: instanceAddrs(x.spec.Instances)})
		if x.svc.Namespace == "kube-public" {
			notes["kube-public"] = true
		}
	}
	rep.Settings = settingNotes(notes)
	return rep
}

// whyNot names the Kubernetes Service consul-k8s's entries of name in ns
// came from, and why fleetsync would register none of them.
func whyNot(ns, name string, in []preflightInput, sel supervisor.Selector, cfg config, notes map[string]bool) (string, string) {
	for _, x := range in {
		s := x.svc
		if s.Namespace != ns {
			continue
		}
		ann, annotated := s.Annotations[worker.AnnotationName]
		switch {
		case annotated && strings.TrimSpace(ann) == name:
		case !annotated && (name == s.Name || name == s.Name+"-"+ns || strings.HasSuffix(name, s.Name) || strings.HasSuffix(name, s.Name+"-"+ns)):
		default:
			continue
		}
		switch {
		case !x.selected:
			return s.Name, notSelected(s, sel, notes)
		case x.err != nil:
			return s.Name, "its annotations are refused: " + x.err.Error()
		case len(x.spec.Instances) == 0:
			return s.Name, "fleetsync would register no instance (no ready endpoint, or none with the port; see its Events after the switch)"
		case x.spec.Name != name:
			if name == s.Name+"-"+ns && !cfg.AddNamespaceSuffix {
				notes["suffix"] = true
			}
			return s.Name, fmt.Sprintf("fleetsync names it %q (--service-prefix, --add-namespace-suffix)", x.spec.Name)
		}
	}
	return "", "no Service of namespace " + ns + " would be named so (the Service is gone, or consul-k8s's naming flags differ)"
}

// notSelected says why sel leaves s out, as supervisor.Selector decides.
func notSelected(s *k8s.Service, sel supervisor.Selector, notes map[string]bool) string {
	v, annotated := s.Annotations[worker.AnnotationSync]
	switch {
	case s.Type == corev1.ServiceTypeExternalName:
		return "an ExternalName Service (never synced)"
	case sel.SkipClusterIP && (s.Type == corev1.ServiceTypeClusterIP || s.Type == ""):
		return "a ClusterIP Service and --sync-clusterip-services=false"
	case !sel.NamespaceAllowed(s.Namespace):
		return "namespace " + s.Namespace + " is left out by --allow-namespace/--deny-namespace"
	case annotated:
		return worker.AnnotationSync + "=" + strconv.Quote(v)
	default:
		notes["default-sync"] = true
		return "not annotated " + worker.AnnotationSync + ", and --default-sync=false"
	}
}

func settingNotes(notes map[string]bool) []string {
	var out []string
	if notes["default-sync"] {
		out = append(out, "consul-k8s syncs Services without the "+worker.AnnotationSync+" annotation (its chart's syncCatalog.default: true); fleetsync's --default-sync is false by default: set --default-sync=true (chart sync.defaultSync) to keep them")
	}
	if notes["suffix"] {
		out = append(out, "consul-k8s appends -<namespace> to names (its chart's syncCatalog.addK8SNamespaceSuffix: true); set --add-namespace-suffix=true (chart sync.addNamespaceSuffix) to keep those names")
	}
	if notes["kube-public"] {
		out = append(out, "consul-k8s's chart denies kube-system and kube-public (syncCatalog.k8sDenyNamespaces); fleetsync denies kube-system only: add --deny-namespace=kube-public to match")
	}
	return out
}

// differences lists how fleetsync's instance (the Service's first) differs
// from consul-k8s's entry in what clients read: name, tags, meta, check.
func differences(e conn.ForeignEntry, in consul.Instance, cfg config) []string {
	var out []string
	if e.Service != in.Name {
		out = append(out, fmt.Sprintf("name %q instead of %q", in.Name, e.Service))
	}
	if lost := minus(e.Tags, in.Tags); len(lost) > 0 {
		out = append(out, "tags dropped: "+strings.Join(lost, ", "))
	}
	if added := minus(in.Tags, e.Tags); len(added) > 0 {
		out = append(out, "tags added: "+strings.Join(added, ", "))
	}
	var lost []string
	for k := range e.Meta {
		if _, ok := in.Meta[k]; !ok {
			lost = append(lost, k)
		}
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		hint := ""
		if !cfg.ConsulK8sMeta {
			hint = " (--consul-k8s-meta writes consul-k8s's keys too)"
		}
		out = append(out, "meta keys dropped: "+strings.Join(lost, ", ")+hint)
	}
	if len(e.Checks) > 0 && e.Checks[0].Name == consulK8sCheckName {
		out = append(out, "check "+strconv.Quote(consul.CheckName)+" instead of "+strconv.Quote(consulK8sCheckName))
	}
	return out
}

func consulK8sAddrs(es []conn.ForeignEntry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, hostPort(e.Address, e.Port))
	}
	return sortedUnique(out)
}

func instanceAddrs(ins []consul.Instance) []string {
	out := make([]string, 0, len(ins))
	for _, in := range ins {
		out = append(out, hostPort(in.Address, in.Port))
	}
	return sortedUnique(out)
}

func hostPort(addr string, port int) string {
	if strings.Contains(addr, ":") {
		addr = "[" + addr + "]"
	}
	return addr + ":" + strconv.Itoa(port)
}

// minus is a without b's elements.
func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func sortedUnique(s []string) []string {
	sort.Strings(s)
	return slices.Compact(s)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
