package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/admin"
)

// releasedPoll is how often purge --wait-released reads the plan again.
const releasedPoll = 2 * time.Second

// planWhenReleased reads the purge plan until no running fleetsync holds
// the cluster id's claim, for at most wait (0: read once): so that purge
// can run while the cluster's fleetsync is being stopped (the chart's
// uninstall hook runs once Helm has deleted the Deployment, while its pods
// still shut down). It says once on out that it waits. A plan still
// refused after wait is returned with its refusal.
func planWhenReleased(ctx context.Context, plan func(context.Context) (admin.PurgePlan, error), wait time.Duration, clk clock.Clock, out io.Writer) (admin.PurgePlan, error) {
	deadline := clk.Now().Add(wait)
	said := false
	for {
		p, err := plan(ctx)
		if err != nil {
			return p, err
		}
		refusal := p.Refusal()
		if refusal == nil || !clk.Now().Before(deadline) {
			return p, refusal
		}
		if !said {
			fmt.Fprintf(out, "Waiting up to %s for the fleetsync holding cluster id %s (holder %q) to stop...\n", wait, p.Cluster.ID(), p.Claim.Holder)
			said = true
		}
		t := clk.NewTimer(min(releasedPoll, deadline.Sub(clk.Now())))
		select {
		case <-ctx.Done():
			t.Stop()
			return p, fmt.Errorf("%w (waited for the claim's release: %w)", refusal, ctx.Err())
		case <-t.C():
		}
	}
}
