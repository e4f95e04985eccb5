// Package k8smark is the ownership mark of the Kubernetes objects fleetsync
// makes from Consul (the to-k8s direction): the only code that makes an
// object "ours" (Stamp) or proves one is (Owns).
//
// An object is cluster C's when, and only when, its labels hold both
// endpointslice.kubernetes.io/managed-by=to-k8s.fleetsync.io and
// fleetsync.io/cluster=C. Selector is that pair as a label selector: the
// informers of package k8s/owned see nothing else, and package k8s/apply
// refuses to create, update or delete an object Owns rejects. A Mark is
// immutable and safe for concurrent use.
//
// Marked (any cluster's mark, managed-by alone) is what the Kubernetes ->
// Consul direction skips: an object made from Consul never goes back.
package k8smark
