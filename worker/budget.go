package worker

import (
	"context"

	"github.com/fleetsync/fleetsync/consul"
)

// acquire waits for the write budget for ch, the diff of the state seen at
// notification count gen. If a notification came while the worker waited,
// it diffs again: the latest state is what gets written (or nothing, if it
// now agrees). Otherwise ch still holds: the owned state changes only in
// this goroutine, and every change of a worker's inputs (its Service, its
// slices, the nodes, a name reservation) notifies it; a cold start of
// 10,000 Services, all waiting for the budget, computed every desired
// state twice before (21 % of its CPU). High priority goes to isolated
// changes and to changes that only remove instances.
func (w *Worker) acquire(ctx context.Context, high bool, ch consul.Change, gen uint64) (consul.Change, *syncResult, error) {
	if w.early != nil { // waited for before the look, which saw the latest state
		permit := *w.early
		w.early = nil
		if err := ctx.Err(); err != nil || ch.Empty() {
			permit.Release()
			return consul.Change{}, nil, err
		}
		ch.High, ch.Permit = high, permit
		ch.NodeFor = w.opts.Config.Cluster.NodeNameFor
		return ch, nil, nil
	}
	permit, err := w.opts.Store.Acquire(ctx, high)
	if err != nil {
		return consul.Change{}, nil, err
	}
	var again *syncResult
	if w.events.Load() != gen {
		ch2, r := w.look()
		again = &r
		if r.invalid {
			permit.Release()
			return consul.Change{}, again, nil
		}
		ch = ch2
	}
	if ch.Empty() {
		permit.Release()
		return ch, again, nil
	}
	ch.High, ch.Permit = high, permit
	ch.NodeFor = w.opts.Config.Cluster.NodeNameFor
	return ch, again, nil
}

// waitBudgetFirst waits for the write budget before the flush when the
// worker owns nothing in Consul (a cold start, a new Service): its change
// can then only register instances, at the priority the flush would ask
// for (an isolated flush high, else bulk; there is nothing to remove), so
// waiting before the look instead of after it changes no order. What it
// saves: 10,000 Services of a cold start waiting for the budget each held
// their computed desired state and change while they waited, 62 of the
// 175 MiB of live heap at the cold start's peak (make bench, 10,000 x
// 10). The look then runs once the permit is there and sees the latest
// state; a flush that finds nothing to write gives the permit back. A
// worker that owns entries looks first: most of its looks (a restart, a
// resync) write nothing and need no budget. So does a worker whose last
// look found nothing to write (a Service without endpoints, or with
// annotations it cannot use): a look that writes nothing must not cost a
// rate token of --consul-max-writes-per-second, or a high-priority wait
// ahead of real writes, on each of its Service's changes. The error is
// ctx's.
func (w *Worker) waitBudgetFirst(ctx context.Context, s *scheduler) error {
	if !w.ownedKnown || len(w.owned) > 0 || w.resyncDue || w.lookedEmpty || w.early != nil {
		return nil
	}
	w.setState(StateFlushing)
	permit, err := w.opts.Store.Acquire(ctx, s.isolated)
	if err != nil {
		return err
	}
	w.early = &permit
	return nil
}
