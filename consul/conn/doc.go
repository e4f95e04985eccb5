// Package conn is fleetsync's connection to Consul: the addresses and
// client-side failover between several servers (Servers) of one
// datacenter of one Consul cluster, checked at start and named on every
// request (Servers.Identify), with failback to the first, the ACL token
// (a file watched, or a login through an auth method), TLS and the
// warnings about insecure TLS settings, the check of the token's
// permissions, the start-up retries and the health probe (Health).
//
// A Conn (Open for the operator commands, Dial for the daemon) holds the
// consul/api client; it hands it only to the packages under consul/ that
// build on it (Conn.API, Conn.Wire). The package knows nothing of
// ownership or of what is written.
package conn
