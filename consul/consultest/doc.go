// Package consultest is an in-memory twin of the parts of Consul's HTTP API
// that fleetsync uses, for fast unit tests of every package. It serves the
// real wire format on a loopback httptest server, so a test drives it with
// the real consul/api client and the real consul.Client.
//
// Semantics copied from Consul 1.14 (agent/consul/state, pinned by this
// package's tests, and compared with the real agent by TestTwinAgreesWithAgent
// when FLEETSYNC_TOOLS_BIN is set):
//
//   - /v1/txn is all-or-nothing: one failed op rolls every op back and the
//     answer is 409 with each failed op's index and reason; a write
//     transaction consumes one raft index whether it commits or not.
//
//   - Node, service and check ops: set, cas (ModifyIndex 0 means create only
//     if absent), delete, delete-cas (on the ModifyIndex read), get. A node
//     op replaces the node record (address, meta); a service or check write
//     that changes nothing keeps its ModifyIndex; a service needs its node, a
//     service check its service (a check cas on a missing service succeeds
//     and writes nothing, as Consul 1.14 does); deleting a node deletes its
//     services and checks, deleting a service its checks.
//
//   - Indexes only grow: per table (nodes, services, checks, kvs and
//     tombstones) and per node (a node's own writes and its services'); as
//     in Consul, a service write or delete raises the nodes table's index
//     too, and a check's only the checks table's; a read answers X-Consul-Index like Consul (a missing node: the last node
//     deletion; a missing KV key: the whole KV table; never 0), and
//     /v1/health/service/:name the name's own index (raised by every
//     write of a service or check of that name, or of a node one is on).
//
//   - Reads honour ?filter= (go-bexpr, Consul's filter engine) and
//     ?node-meta=; KV get, put (with ?cas=) and delete (with ?cas=: a
//     missing key's delete-cas succeeds, as Consul's does).
//
//   - KV locks: sessions are created, renewed and destroyed (destroying one
//     lets its locks go, as Consul's release behaviour does); PUT ?acquire=
//     takes a free key or rewrites one the session holds; a txn's
//     check-session passes only while the key is locked by that session (a
//     missing or free key fails). Session TTLs, health checks and lock
//     delays are not kept.
//
//   - With EnableACL, logins and tokens as Consul's ACL system answers them
//     (see ACL).
//
//   - With EnableNamespaces, Consul Enterprise's namespaces as fleetsync
//     and consul-k8s use them: read, create, and a transaction op into a
//     missing namespace refused (see Namespaces; not compared with an
//     Enterprise server, none runs here).
//
// Blocking queries and ACL policies are not served (fleetsync's catalog
// code uses neither; its permission tests run against the real agent).
package consultest
