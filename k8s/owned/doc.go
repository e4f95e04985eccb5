// Package owned watches the Kubernetes objects that carry a label selector
// (the to-k8s mark, package ownership/k8smark): one informer for
// EndpointSlices and one for Services, both listed and watched with that
// selector only, so nothing else is ever cached or handed out.
//
// Slices are indexed by their Service ("namespace/<label
// kubernetes.io/service-name>"). Handler is called with a Service's
// namespace and name for every add, update and delete of that Service or
// of one of its slices: it means "look again", nothing more, runs on an
// informer goroutine and must return quickly. WaitForSync returns true once
// both informers listed everything. Objects handed out are the cache's:
// read-only. The package imports nothing else of fleetsync's.
package owned
