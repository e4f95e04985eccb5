package tok8s

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
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

// importUnit is one annotated Service: usable (problem "") or reported.
type importUnit struct {
	consul, port string
	obj          *corev1.Service
	problem      string
}

// importOf reads an annotated Service; ok is false when it has no
// fleetsync.io/consul-service annotation.
func importOf(svc *k8s.Service) (u importUnit, ok bool) {
	name, ok := svc.Annotations[k8smark.AnnotationConsulService]
	if !ok || svc.Object == nil {
		return importUnit{}, false
	}
	u = importUnit{consul: strings.TrimSpace(name), obj: svc.Object}
	switch spec := svc.Object.Spec; {
	case u.consul == "" || strings.ContainsAny(u.consul, "/ "):
		u.problem = fmt.Sprintf("annotation %s=%q: not a Consul service name", k8smark.AnnotationConsulService, name)
	case len(spec.Selector) > 0:
		u.problem = fmt.Sprintf("annotation %s: the Service has a selector; fleetsync only fills selectorless Services", k8smark.AnnotationConsulService)
	case spec.Type != corev1.ServiceTypeClusterIP && spec.Type != "":
		u.problem = fmt.Sprintf("annotation %s: the Service is of type %s; only ClusterIP (headless included) is filled", k8smark.AnnotationConsulService, spec.Type)
	case len(spec.Ports) != 1:
		u.problem = fmt.Sprintf("annotation %s: the Service has %d ports; it needs exactly one", k8smark.AnnotationConsulService, len(spec.Ports))
	default:
		u.port = spec.Ports[0].Name
	}
	return u, true
}

// ServiceChanged is told of every change of a Service (k8s.WatcherOptions.OnService).
func (s *Supervisor) ServiceChanged(key k8s.Key) {
	if s.opts.Imports == nil {
		return
	}
	if s.refreshImport(key) { // others' Services cost a cache read, nothing more
		s.changed(owned.Key{Namespace: key.Namespace, Name: key.Name})
	}
}

// refreshImport reads key again and reports a new problem once; it
// returns whether key is or was an import-mode Service.
func (s *Supervisor) refreshImport(key k8s.Key) bool {
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
	return ok || had
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
	unit := wtok8s.Unit{Namespace: k.Namespace, Name: k.Name, ConsulName: u.consul, PortName: u.port}
	return unit, u.obj, u.problem == "", true
}
