// Package consul is the catalog store: it reads fleetsync's owned state
// from the Consul catalog and writes changes to it as transactions.
//
// Contract:
//
//   - A Client is built with an Owner (package ownership). Every instance it is
//     asked to write must be stamped with the owner's mark and every entry it is
//     asked to update or delete must be one read from Consul that the owner
//     verifies; anything else is refused before a request is sent. There is no
//     call that deletes by service name or by tag.
//   - Writes go through /v1/txn: the owner's node op first, then service and
//     check ops, at most MaxOps operations (128 by default, Consul's limit) and
//     about MaxBytes of body per transaction. One instance's ops never straddle
//     two transactions.
//   - Creates are CAS with index 0 (create only if absent); updates and deletes
//     are CAS on the ModifyIndex that was read. A failed CAS returns an error
//     matching ErrConflict: the caller re-reads and diffs again; nothing is
//     ever overwritten blindly.
//   - Reads and writes honour the context; a cancelled context returns its
//     error.
//   - A Client is built over a connection (NewConnClient, package
//     conn) or, in tests, over a consul/api client (NewClient). Nothing
//     outside the packages under consul/ holds the consul/api client.
//
// A Client is safe for concurrent use.
package consul

// BrokenBuild reports whether this binary is the soak's deliberately broken
// build (-tags fleetsync_broken_nodelete); the daemon says so at start.
func BrokenBuild() bool { return brokenNoDelete }
