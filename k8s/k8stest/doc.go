// Package k8stest is an in-memory stand-in for k8s.Watcher, for the unit
// tests of the packages downstream of k8s (the supervisor's Watcher
// interface). It holds Service views the test sets, calls the handler on
// every change as the informers do, and reports synced when told.
// Behaviour that crosses the Kubernetes API is tested against the real
// kube-apiserver (test/stack), not with this.
package k8stest
