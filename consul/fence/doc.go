// Package fence keeps one fencing token per shard in Consul's KV store, so
// that a replica which froze past its shard Lease (SIGSTOP, a long GC or VM
// pause, cut off from the API server but not from Consul) cannot commit the
// transaction it had in flight for a shard it no longer holds.
//
// Shard k's token is the key <claim prefix>/<cluster id>/shards/<k>, whose
// value names the holder and a generation. A replica that gains a shard
// takes the token (Fences.Take): it writes generation+1 naming itself,
// CAS on the index it read, and keeps the index it wrote. Every catalog
// transaction of that shard's workers carries a check-index on the key
// (Token.Ops, a consul.Guard given as consul.Change.Fence), next to the
// cluster-id claim's. Once another replica has taken the shard, the key's
// index has moved and Consul refuses the whole transaction; Token.Failed
// reads the key, sees the newer generation, and from then on the token
// refuses every write (Ops returns an error matching consul.ErrFenced)
// without sending it: the stale write is never retried.
//
// A refused check whose key still names this replica at this generation
// (the key rewritten, or restored with a new index) adopts the new index.
// A key that is gone, or holds an older generation taken before this
// token (Consul lost its data, or was restored to an older snapshot), is
// written again at this token's generation. Another replica's value taken
// after this token (TakenAt, by each replica's clock) fences it whatever
// its generation: Consul lost the key and that replica took the shard from
// generation 1 again. A replica that froze can still write once more when
// Consul was restored meanwhile to a snapshot from before the newer
// holder's take, or lost the key and no replica took the shard since: the
// fence guards against a pause, not against a pause and a rollback of
// Consul's data at once.
//
// Without shards (--shards 1) there is no token and no extra op.
package fence
