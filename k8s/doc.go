// Package k8s is fleetsync's reader of Services, EndpointSlices, Nodes and
// Ingresses in the Kubernetes API: it watches them and hands out a typed,
// read-only view of one Service at a time. The only other package that
// talks to the Kubernetes API is supervisor/shard, which alone reads and
// writes coordination.k8s.io Leases (with --shards > 1).
//
// # What the Watcher guarantees
//
//   - One informer per kind. A Watcher runs exactly one shared Service
//     informer, one shared discovery.k8s.io/v1 EndpointSlice informer, one
//     Node informer (NewWatcher; WatcherOptions.Nodes) and, with
//     WatcherOptions.Ingresses, one networking.k8s.io/v1 Ingress informer
//     for the whole cluster, however many Services are synced: never a watch
//     or a request per Service or per endpoint. Slices are indexed by
//     "namespace/<label kubernetes.io/service-name>" and by the nodeName of
//     their endpoints; Ingresses by the Services their "/" rules send to.
//   - Nodes cost little. A cached Node keeps its name, resourceVersion and
//     status.addresses only (a transform drops the rest before it is
//     stored). A Node whose addresses changed (or that came or went)
//     notifies exactly the NodePort Services with an endpoint on it; a
//     Node update that leaves the addresses alone (a heartbeat) notifies
//     nothing. An Ingress notifies the Services its "/" rules send to,
//     before and after a change.
//   - Level-based notifications. Handler.Changed(key) means "look at this
//     Service again", nothing more: it carries no event type and no object.
//     A burst of changes may produce one call or many; a caller reads the
//     current state with Watcher.Service and acts on that. Changed is called
//     for every add, update and delete of a Service, and of an EndpointSlice
//     that names a Service in its kubernetes.io/service-name label (slices
//     without it are ignored; a slice whose label changed notifies both keys).
//     Updates that carry an unchanged resourceVersion (informer resyncs,
//     relists after a watch gap) notify only when a resync period is set.
//     Changed runs on an informer goroutine and must return quickly.
//   - Complete initial state. WaitForSync returns true only once every
//     informer has listed everything and Changed has been called for every
//     Service and slice of that first list. Callers must not delete anything
//     in Consul before that.
//   - Views are built on demand and are read-only. Watcher.Service builds a
//     Service from the caches at call time, merging every slice of the
//     Service, deduplicating endpoints by address and sorting them by Address
//     (string order). Nothing is deep-copied: Service.Annotations and
//     Service.Object are the cached values and must not be mutated. The two
//     caches are independent, so a view may pair a Service spec with slices
//     a moment older or newer; the next Changed call brings the next view.
//   - Input problems are reported, not fatal. Unusable parts of a slice
//     (an FQDN slice, an address that is not an IP, a port without a number)
//     are skipped and described in Service.Problems, sorted.
//   - Memory. Cached objects lose their managedFields and the
//     kubectl.kubernetes.io/last-applied-configuration annotation before
//     they are stored; no other copy is kept.
//   - Goroutines end. Start runs the informers on goroutines that end when
//     its context is cancelled; Wait returns once they all have.
//
// # Writes
//
// The package never writes to the cluster, except Events through Recorder
// (rate-limited and deduplicated by client-go's event correlator). The RBAC
// it needs: list and watch on services, discovery.k8s.io endpointslices,
// nodes and (with --enable-ingress) networking.k8s.io ingresses, get on the
// kube-system namespace (ClusterUID), and create and patch on events.
package k8s
