// Package consul reads fleetsync's owned state from the Consul catalog and
// writes changes to it as transactions.
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
//   - Nothing outside this package holds the consul/api client: a Conn
//     (Open for the operator commands, Dial for the daemon: failover,
//     token source, login) builds every Client, Health, Claim, Purger and
//     Inventory.
//   - The operator's deletes (Purger, `fleetsync purge`) are conditional on
//     what was read, like the Client's: instances through the Client (Owns
//     on each, delete-CAS); a node only after its owner's OwnsNode accepts
//     it, fenced, read again, and deleted with a CAS on the fenced index
//     while it holds nothing; the claim key with a CAS on the index read
//     while no session holds it. Whose a node or an entry is, is decided by
//     the owner (package ownership), never here.
//
// A Client is safe for concurrent use.
package consul

// BrokenBuild reports whether this binary is the soak's deliberately broken
// build (-tags fleetsync_broken_nodelete); the daemon says so at start.
func BrokenBuild() bool { return brokenNoDelete }
