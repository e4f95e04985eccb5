package tok8s

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
	"github.com/fleetsync/fleetsync/worker"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

// Imports is the cluster's Services as the Kubernetes -> Consul direction's
// shared informer sees them (k8s.Watcher): import mode's source.
type Imports interface {
	WaitForSync(ctx context.Context) bool
	Keys() []k8s.Key
	Head(key k8s.Key) (*k8s.Service, bool, error)
}

// ReasonInvalidAnnotation is the Event of an import-mode Service that
// cannot be used.
const ReasonInvalidAnnotation = "InvalidAnnotation"

// The optional annotations of an import-mode Service.
const (
	AnnotationDatacenter = "fleetsync.io/consul-datacenter" // the Consul datacenter to read
	AnnotationNamespace  = "fleetsync.io/consul-namespace"  // the Consul namespace (Enterprise)
	AnnotationPartition  = "fleetsync.io/consul-partition"  // the Consul admin partition (Enterprise)
	AnnotationTag        = "fleetsync.io/consul-tag"        // only instances with this tag
	AnnotationFilter     = "fleetsync.io/consul-filter"     // a Consul filter expression
	AnnotationWindow     = "fleetsync.io/window"            // the unit's batching window
)

// source is what feeds a unit: a Consul service read with a query, and
// the unit's window (negative: the fleet's). Two units with different
// sources are different workers.
type source struct {
	consul string
	query  watch.Query
	window time.Duration
}

// importUnit is one annotated Service: usable (problem "") or reported.
type importUnit struct {
	src     source
	port    string
	obj     *corev1.Service
	problem string
}

// importOf reads an annotated Service; ok is false when it has no
// fleetsync.io/consul-service annotation or is a mirrored Service (marked:
// fleetsync annotates those too).
func importOf(svc *k8s.Service) (u importUnit, ok bool) {
	name, ok := svc.Annotations[k8smark.AnnotationConsulService]
	if !ok || svc.Object == nil || k8smark.Marked(svc.Object.Labels) {
		return importUnit{}, false
	}
	u = importUnit{src: source{consul: strings.TrimSpace(name), window: -1}, obj: svc.Object}
	switch spec := svc.Object.Spec; {
	case u.src.consul == "" || strings.ContainsAny(u.src.consul, "/ "):
		u.problem = fmt.Sprintf("annotation %s=%q: not a Consul service name", k8smark.AnnotationConsulService, name)
	case len(spec.Selector) > 0:
		u.problem = fmt.Sprintf("annotation %s: the Service has a selector; fleetsync only fills selectorless Services", k8smark.AnnotationConsulService)
	case spec.Type != corev1.ServiceTypeClusterIP && spec.Type != "":
		u.problem = fmt.Sprintf("annotation %s: the Service is of type %s; only ClusterIP (headless included) is filled", k8smark.AnnotationConsulService, spec.Type)
	case len(spec.Ports) != 1:
		u.problem = fmt.Sprintf("annotation %s: the Service has %d ports; it needs exactly one", k8smark.AnnotationConsulService, len(spec.Ports))
	default:
		u.port = spec.Ports[0].Name
		u.problem = u.src.readOptional(svc.Annotations)
	}
	return u, true
}

// readOptional fills src from the optional annotations; it returns the
// first bad one's problem, naming it, or "".
func (src *source) readOptional(ann map[string]string) string {
	fields := []struct {
		key   string
		into  *string
		check func(string) error
	}{
		{AnnotationDatacenter, &src.query.Datacenter, watch.ValidateDatacenter},
		{AnnotationNamespace, &src.query.Namespace, watch.ValidateTenancy},
		{AnnotationPartition, &src.query.Partition, watch.ValidateTenancy},
		{AnnotationTag, &src.query.Tag, validTag},
		{AnnotationFilter, &src.query.Filter, watch.ValidateFilter},
	}
	for _, f := range fields {
		v, ok := ann[f.key]
		if !ok {
			continue
		}
		if err := f.check(strings.TrimSpace(v)); err != nil {
			return fmt.Sprintf("annotation %s=%q: %v", f.key, v, err)
		}
		*f.into = strings.TrimSpace(v)
	}
	if v, ok := ann[AnnotationWindow]; ok {
		d, err := worker.ParseWindow(v)
		if err != nil {
			return fmt.Sprintf("annotation %s=%q: %v", AnnotationWindow, v, err)
		}
		src.window = d
	}
	return ""
}

// validTag checks a tag: not empty, no control characters.
func validTag(tag string) error {
	if tag == "" || strings.IndexFunc(tag, unicode.IsControl) >= 0 {
		return fmt.Errorf("not a Consul tag (empty, or control characters)")
	}
	return nil
}

// ServiceChanged is told of every change of a Service (k8s.WatcherOptions.OnService).
func (s *Supervisor) ServiceChanged(key k8s.Key) {
	if s.opts.Imports == nil {
		return
	}
	// Others' Services cost a cache read, nothing more.
	switch is, moved := s.refreshImport(key); {
	case moved:
		s.reconcile() // a new source: its worker restarts with it
	case is:
		s.changed(owned.Key{Namespace: key.Namespace, Name: key.Name})
	}
}

// refreshImport reads key again and reports a new problem once; it
// returns whether key is or was an import-mode Service, and whether its
// source or problem changed.
func (s *Supervisor) refreshImport(key k8s.Key) (is, moved bool) {
	k := owned.Key{Namespace: key.Namespace, Name: key.Name}
	svc, found, err := s.opts.Imports.Head(key)
	var u importUnit
	ok := false
	if err == nil && found {
		u, ok = importOf(svc)
	}
	s.mu.Lock()
	old, had := s.imports[k]
	if ok {
		s.imports[k] = u
	} else {
		delete(s.imports, k)
	}
	s.mu.Unlock()
	if ok && u.problem != "" && (!had || old.problem != u.problem) {
		s.log.Warn("Import-mode Service not usable", "service", k.String(), "problem", u.problem)
		if s.opts.Reporter != nil {
			s.opts.Reporter.Warning(u.obj, ReasonInvalidAnnotation, u.problem)
		}
	}
	return ok || had, ok != had || old.src != u.src || old.problem != u.problem
}

// loadImports reads every Service once the informer synced.
func (s *Supervisor) loadImports(ctx context.Context) bool {
	if s.opts.Imports == nil {
		return true
	}
	if !s.opts.Imports.WaitForSync(ctx) {
		return false
	}
	for _, k := range s.opts.Imports.Keys() {
		s.refreshImport(k)
	}
	return true
}

// importLookup is the worker's view of an import unit; s.mu is held.
func (s *Supervisor) importLookup(k owned.Key) (wtok8s.Unit, *corev1.Service, bool, bool) {
	u, ok := s.imports[k]
	if !ok {
		return wtok8s.Unit{}, nil, false, false
	}
	unit := wtok8s.Unit{Namespace: k.Namespace, Name: k.Name, ConsulName: u.src.consul, PortName: u.port, CatalogDecides: s.waitsLocked(k)}
	return unit, u.obj, u.problem == "", true
}

// The deletion guard judges an import unit like a mirrored Service when
// it reads the daemon's own scope (no datacenter, namespace or partition
// annotation): the catalog the supervisor watches is that scope's. A unit
// that names another datacenter, namespace or partition is not judged: the
// catalog watched says nothing of it, and an empty health answer empties
// its slices.

// ownScope reports whether the guard judges import unit u.
func ownScope(u importUnit) bool {
	q := u.src.query
	return u.problem == "" && q.Datacenter == "" && q.Namespace == "" && q.Partition == ""
}

// importsDropped is the import units of the daemon's scope that have
// slices and whose Consul name the latest catalog answer lacks (gone), and
// how many such units have slices (imported); s.mu is held.
func (s *Supervisor) importsDropped() (gone map[owned.Key]bool, imported int) {
	gone = map[owned.Key]bool{}
	for k, u := range s.imports {
		if !ownScope(u) || len(s.opts.Owned.Slices(k.Namespace, k.Name)) == 0 {
			continue
		}
		imported++
		if _, ok := s.names[u.src.consul]; !ok {
			gone[k] = true
		}
	}
	return gone, imported
}

// waitsLocked reports whether import unit k leaves an empty health answer
// to the catalog (wtok8s.Unit.CatalogDecides): the guard holds it, or it
// reads the daemon's scope with neither tag nor filter (whose empty answer
// can be the instances narrowed out while the name stays) and the latest
// catalog answer lists its name; s.mu is held.
func (s *Supervisor) waitsLocked(k owned.Key) bool {
	u, ok := s.imports[k]
	if !ok {
		return false
	}
	if s.held[k] {
		return true
	}
	_, listed := s.names[u.src.consul]
	return ownScope(u) && u.src.query.Tag == "" && u.src.query.Filter == "" && listed
}

// waitingLocked is waitsLocked of every import unit; s.mu is held.
func (s *Supervisor) waitingLocked() map[owned.Key]bool {
	out := make(map[owned.Key]bool, len(s.imports))
	for k := range s.imports {
		out[k] = s.waitsLocked(k)
	}
	return out
}

// feed is the health read and the configuration of a worker fed by src:
// no read for a unit that is not selected (src.consul ""), src's query,
// src's window over the fleet's.
func (s *Supervisor) feed(src source) (wtok8s.Health, wtok8s.Config) {
	cfg := s.opts.Config
	if src.consul == "" {
		return nil, cfg
	}
	if src.window >= 0 {
		cfg.Window = src.window
	}
	q := src.query
	cfg.EmptyIsAnswer = q.Filter != "" // filtered out, or gone: only an unfiltered read tells
	return func(ctx context.Context, name string, index uint64) (watch.Instances, uint64, error) {
		return s.opts.Health(ctx, name, q, index)
	}, cfg
}
