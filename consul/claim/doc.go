// Package claim holds a cluster id for one Kubernetes cluster in Consul:
// a KV key under a prefix, locked by a session that lives as long as the
// process. A Claim is the consul.Client's Guard: every transaction carries
// a check that the key still names this cluster, so no write lands once
// another Kubernetes cluster has taken the id (ErrLost).
package claim
