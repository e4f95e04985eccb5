package supervisor

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
	"github.com/fleetsync/fleetsync/worker"
)

// Selector decides which Services are synced.
type Selector struct {
	DefaultSync bool
	Allow       []string // namespace patterns (path.Match syntax, "*" for all)
	Deny        []string // namespace patterns; deny wins
	// SkipClusterIP leaves ClusterIP Services (headless ones included) out,
	// as consul-k8s's -sync-clusterip-services=false.
	SkipClusterIP bool
}

// Validate checks the patterns.
func (s Selector) Validate() error {
	for _, p := range append(append([]string{}, s.Allow...), s.Deny...) {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("namespace pattern %q: %w", p, err)
		}
	}
	return nil
}

// NamespaceAllowed reports whether Services of namespace ns may be synced.
func (s Selector) NamespaceAllowed(ns string) bool {
	if matchAny(s.Deny, ns) {
		return false
	}
	return matchAny(s.Allow, ns)
}

// Selected reports whether svc is synced. An unparseable service-sync value
// counts as opted in, so that the worker reports it (as an invalid
// annotation) instead of silently deregistering the Service.
func (s Selector) Selected(svc *k8s.Service) bool {
	if svc == nil || svc.Type == corev1.ServiceTypeExternalName {
		return false
	}
	if svc.Object != nil && k8smark.FromConsul(svc.Object.Labels, svc.Annotations) {
		return false // made from Consul (to-k8s): never back to Consul
	}
	if s.SkipClusterIP && (svc.Type == corev1.ServiceTypeClusterIP || svc.Type == "") {
		return false
	}
	if !s.NamespaceAllowed(svc.Namespace) {
		return false
	}
	if v, ok := svc.Annotations[worker.AnnotationSync]; ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return true
		}
		return b
	}
	return s.DefaultSync
}

func matchAny(patterns []string, ns string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, ns); ok {
			return true
		}
	}
	return false
}
