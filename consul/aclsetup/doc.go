// Package aclsetup creates, with a management token, the Consul ACL
// objects one cluster's fleetsync needs, and nothing more: a policy with
// exactly its rules (its nodes, the synced service names, the claim's
// session and key), a role holding it, and, for a login, a binding rule
// that binds fleetsync's Kubernetes ServiceAccount to the role on a
// Kubernetes auth method (what consul-k8s's server-acl-init does for its
// own components). Apply is idempotent: an object that is already as wanted
// is left alone, one that differs is updated, a missing one created; it
// returns what it did.
package aclsetup
