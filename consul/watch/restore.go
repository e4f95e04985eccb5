package watch

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"k8s.io/utils/clock"
)

// restoreWindow: a blocking query that begins this soon after a restore
// was found reads from scratch first. Its index may be one from before
// the restore: the answer that carried it came back just before the
// restore was found, too late for the abort of the queries in flight.
const restoreWindow = time.Second

// restores finds that Consul's state went back (a snapshot restore, or a
// Consul that lost its data) and makes every blocking query of the Client
// read from scratch.
//
// Why it is needed (Consul 1.14): after a restore the X-Consul-Index of
// each endpoint is that of the snapshot's data, lower than before. The
// catalog's blocking query in flight returns at once, but with the old
// data at its old index (not a change by the index rules); the health
// queries (Consul's streaming backend) are not woken at all; and a query
// asked again with an old index blocks on the restored state until a write
// lands past it or the wait passes: the restored state would reach
// Kubernetes only minutes later. So a return of the catalog's query that
// is no change is checked by a read from scratch from the leader (one read
// per wait, or per restore): an index below the highest one read is a
// restore, and so is a return before half the wait passed (a restore that
// left the service names as they were, a check turned back, leaves the
// catalog's index where it was: only the early return tells; a Consul
// whose max_query_time is below half the wait would cost every watch one
// read per wait). Then the blocking queries in flight are aborted and read
// from scratch, and so do those that begin within restoreWindow; a read
// from scratch whose index is the one held blocks on it.
type restores struct {
	clock clock.Clock
	found func() // told each restore found; may be nil

	mu      sync.Mutex
	catalog uint64             // the highest catalog index read
	next    context.Context    // done when the next restore is found
	cancel  context.CancelFunc // of next
	at      time.Time          // when the last restore was found
}

func newRestores(clk clock.Clock, found func()) *restores {
	r := &restores{clock: clk, found: found}
	r.next, r.cancel = context.WithCancel(context.Background())
	return r
}

// catalogRead records a catalog index read from the leader after a return
// that was no change; an index below the highest one read is a restore,
// and so is an early return (see Client.Services).
func (r *restores) catalogRead(index uint64, early bool) {
	r.mu.Lock()
	back := index < r.catalog || early
	r.catalog = index
	if !back {
		r.mu.Unlock()
		return
	}
	r.cancel()
	r.next, r.cancel = context.WithCancel(context.Background())
	r.at = r.clock.Now()
	r.mu.Unlock()
	if r.found != nil {
		r.found()
	}
}

// catalogSeen records a catalog index read from any server (a stale read):
// it raises the highest index read, never finds a restore.
func (r *restores) catalogSeen(index uint64) {
	r.mu.Lock()
	r.catalog = max(r.catalog, index)
	r.mu.Unlock()
}

// recent reports whether a restore was found within restoreWindow: a
// blocking query about to begin may hold an index from before it.
func (r *restores) recent() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.at.IsZero() && r.clock.Since(r.at) < restoreWindow
}

// abortable returns a context for a blocking query that ends when ctx
// does or the next restore is found; stop releases it.
func (r *restores) abortable(ctx context.Context) (_ context.Context, stop func()) {
	r.mu.Lock()
	next := r.next
	r.mu.Unlock()
	qctx, cancel := context.WithCancel(ctx)
	stopAfter := context.AfterFunc(next, cancel)
	return qctx, func() { stopAfter(); cancel() }
}

// aborted reports whether a query with qctx failed because a restore was
// found (not because ctx ended): it is to be asked again from scratch.
func aborted(ctx, qctx context.Context) bool {
	return ctx.Err() == nil && qctx.Err() != nil
}

// ask runs query (one read with index; stale: from any server) until its
// answer stands: a stale answer from a server out of touch with the leader
// for longer than MaxStale is asked again of the leader, and the restore
// rules apply (see restores). A query with an index that may be from
// before a restore just found reads from scratch first, and blocks on the
// index only if it is still the one read; a query aborted by a restore
// found is asked again that way.
func ask[T any](ctx context.Context, c *Client, index uint64, stale bool,
	query func(ctx context.Context, index uint64, stale bool) (T, *api.QueryMeta, error)) (T, *api.QueryMeta, error) {
	recheck := index != 0 && c.restores.recent()
	for {
		qctx, qindex, stop := ctx, index, func() {}
		if recheck {
			qindex = 0
		} else if index != 0 {
			qctx, stop = c.restores.abortable(ctx)
		}
		v, meta, err := query(qctx, qindex, stale)
		stop()
		switch {
		case err != nil && aborted(ctx, qctx):
			recheck = true
		case err != nil:
			return v, nil, err
		case stale && c.tooStale(meta):
			stale = false
		case recheck && meta.LastIndex == index:
			recheck = false
		default:
			return v, meta, nil
		}
	}
}
