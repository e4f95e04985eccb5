// Package admin holds the operator commands' reads and deletes of Consul:
// Inspect lists every cluster fleetsync syncs into a Consul (`fleetsync
// status`), a Purger removes one cluster that is gone for good (`fleetsync
// purge`). Only those commands import it; the daemon never does.
//
// Contract: the deletes are conditional on what was read, like the
// catalog store's: instances through a consul.Client (Owns on each,
// delete-CAS); a node only after its owner's OwnsNode accepts it, fenced,
// read again, and deleted with a CAS on the fenced index while it holds
// nothing; the claim key with a CAS on the index read while no session
// holds it. Whose a node or an entry is, is decided by the owner (package
// ownership), never here.
package admin
