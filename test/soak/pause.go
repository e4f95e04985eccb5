package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// soakLeaseDuration is fleetsync's default --lease-duration, which the
// soak's replicas run with: a pause longer than it lets another replica
// take the paused one's shards.
const soakLeaseDuration = 15 * time.Second

// pause is the fleetsync-pause fault: a replica of a sharded cluster is
// frozen (SIGSTOP, as a long GC or VM pause would) for a lease duration
// and hold more, with whatever it had in flight (the churn never stops),
// so the other replica takes its shards; then it is thawed (SIGCONT).
// Its stale transactions must be refused on the shards' fences: the
// checker finds any stale write that landed as a missing or extra
// instance. The replica's fleetsync_shard_fenced_total is logged.
func (w *world) pause(ctx context.Context, rng *rand.Rand, hold time.Duration) error {
	var candidates []*replica
	for _, c := range w.clusters {
		if len(c.replicas) > 1 {
			for _, r := range c.replicas {
				if !r.busy.Load() {
					candidates = append(candidates, r)
				}
			}
		}
	}
	if len(candidates) == 0 {
		return errNotYet // no sharded cluster, or its replicas are restarting
	}
	r := candidates[rng.IntN(len(candidates))]
	d := r.daemon()
	frozen := soakLeaseDuration + hold
	id := w.chk.faultStart("fleetsync-pause", fmt.Sprintf("replica %s frozen (SIGSTOP) for %s, its lease %s", r.id, frozen.Round(time.Second), soakLeaseDuration), nil)
	r.busy.Store(true)
	defer r.busy.Store(false)
	before := fencedOf(ctx, d)
	if err := d.Signal(syscall.SIGSTOP); err != nil {
		w.chk.faultEnd(id)
		return fmt.Errorf("pause replica %s: %w", r.id, err)
	}
	sleep(ctx, frozen)
	err := d.Signal(syscall.SIGCONT) // even when ctx ended: never leave it frozen
	w.chk.thawed(r.id, time.Now())
	w.chk.faultEnd(id)
	if err != nil {
		return fmt.Errorf("thaw replica %s: %w", r.id, err)
	}
	if ctx.Err() == nil {
		sleep(ctx, 2*time.Second) // its in-flight answers and the fence checks
		w.logf("fault fleetsync-pause: replica %s thawed; fleetsync_shard_fenced_total %s -> %s", r.id, before, fencedOf(ctx, d))
	}
	return nil
}

// fencedOf reads fleetsync_shard_fenced_total from d ("?" when it cannot).
func fencedOf(ctx context.Context, d *fixture.Daemon) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, body, err := d.Get(ctx, "/metrics", "")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, "fleetsync_shard_fenced_total "); ok {
			if _, err := strconv.ParseFloat(v, 64); err == nil {
				return v
			}
		}
	}
	return "?"
}
