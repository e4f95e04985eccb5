// Package loss detects that Consul lost or rolled back data: a Consul
// restarted empty, or restored from an older snapshot, under a fleet that
// believes its entries are written.
//
// The evidence, each a Signal (the label of
// fleetsync_consul_data_loss_detected_total):
//
//   - a node of ours gone, or created again (its CreateIndex changed);
//   - a node's catalog index, or Consul's KV index, below one read or
//     written before (a restore takes every index back);
//   - a witness of a committed write of ours not as we left it: the entry
//     gone, older than written, or back after our delete (catalog writes
//     right after a restore can raise the indexes again; they cannot hide
//     this);
//   - a worker's CAS conflict whose re-read shows the same (Watch.Report).
//
// The detector (detector.go, witness.go) decides from reads passed in,
// table-tested; Watch is the loop that reads Consul every interval of the
// injected clock, one Step at a time, and tells its owner of a loss
// through one callback (Config.Lost). Before a witness not as left, or a
// worker's evidence, counts, the owner first forgets the Services it no
// longer syncs though it was not yet told (Config.Confirm: a replica
// stopped past its shard Lease). What to do about a loss (repair the
// fleet) is the owner's.
package loss
