// Package namespaces makes sure a Consul Enterprise namespace exists before
// fleetsync writes into it, as consul-k8s's catalog sync does
// (control-plane/namespaces EnsureExists): a namespace that is missing is
// created, with the cross-namespace ACL policy as its default policy and
// meta external-source=kubernetes.
//
// Contract:
//
//   - Ensure reads the namespace (GET /v1/namespace/<name>) once and
//     creates it (PUT /v1/namespace) only when Consul does not have it;
//     a namespace known to exist is remembered, so steady state costs no
//     request. The default namespace, "" and the wildcard are never read
//     or created.
//   - Callers asking for the same namespace at once share one read and one
//     create. A create that loses a race ("already exists") is success.
//   - Forget drops what is remembered (the namespace was deleted, or Consul
//     lost its data): the next Ensure reads again.
//   - Errors name the namespace; a token that may not read or create it
//     gives an error matching conn.ErrNotPermitted, a Consul without
//     namespaces (OSS) one matching conn.ErrEnterpriseOnly.
//
// An Ensurer is safe for concurrent use.
package namespaces
