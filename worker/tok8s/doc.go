// Package tok8s is the per-unit worker of the Consul -> Kubernetes
// direction: one Worker keeps one Kubernetes Service's EndpointSlices (and,
// in mirror mode, the Service itself) equal to the healthy instances of one
// Consul service.
//
// A Worker holds its own blocking query on the service's health
// (consul/watch), follows the window rules of package worker/window, and
// writes nothing before its first health answer and the fleet's gate. Each
// flush is level-based: Desired (a pure function of the health entries, the
// configuration and the slices already there, so that an endpoint stays in
// its slice) and Diff (a pure function of desired and owned actual) decide
// every write; the writes go through package k8s/apply, stamped with the
// cluster's mark (ownership/k8smark).
//
// Per instance (Config.Keep): proxies and gateways (a Kind), instances with
// the excluded tag, instances on this cluster's own marked Consul nodes
// (the loop guard: they are this cluster's Services), and other Kubernetes
// clusters' instances (external-source=kubernetes) unless IncludeClusters
// names their cluster, are left out. Health maps to conditions as
// docs/design/to-k8s.md says.
package tok8s
