// Package watch holds the blocking queries of the Consul -> Kubernetes
// direction: the catalog's service names (Client.Services, one watch for
// the supervisor) and one service's health entries (Client.Health, one per
// worker). It only reads.
//
// Index rules (Next, and Loop, which applies them): a return is not a
// change, so an answer with the index already seen is dropped; an index
// that goes back (Consul restored or restarted) or is 0 is a full re-read:
// the answer in hand is delivered and the next query starts from 0 (from 1
// for a 0, so that it blocks). A snapshot restore is found by the catalog
// query (a return that is no change is checked by a read from scratch from
// the leader, and one that came early is taken for a restore) and makes
// every blocking query read from scratch: Consul does not wake them with
// the restored state (see restores). Errors are retried with backoff, the
// next query from 0 (a restarted server's index is lower than the one
// held); no error ends a Loop, only its context. A read Consul does not
// answer ends at Options.ReadTimeout (past Wait for a blocking one), an
// error like any other.
//
// Reads may be served by any server (stale) to spread the load; an answer
// whose server lost contact with the leader for longer than
// Options.MaxStale is asked again of the leader.
package watch
