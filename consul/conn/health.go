package conn

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"k8s.io/utils/clock"
)

// Health tracks whether Consul answered recently: every probe (a leader
// lookup each interval) records its outcome. /readyz uses it.
type Health struct {
	api     *api.Client
	clock   clock.Clock
	lastOK  atomic.Int64 // unix nanos of the last success; 0 never
	lastErr atomic.Value // string
	// Timeout bounds each probe (default DefaultRequestTimeout).
	Timeout time.Duration
}

// NewHealth returns a tracker for c.
func NewHealth(c *api.Client, clk clock.Clock) *Health {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Health{api: c, clock: clk}
}

// Run probes every interval until ctx is done, then returns nil (a
// failed probe is recorded for Reachable, not returned). Run it in the
// process's errgroup.
func (h *Health) Run(ctx context.Context, interval time.Duration) error {
	for {
		h.probe(ctx)
		t := h.clock.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

func (h *Health) probe(ctx context.Context) {
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	leader, err := h.api.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(pctx))
	switch {
	case err != nil:
		h.lastErr.Store(err.Error())
	case leader == "":
		h.lastErr.Store("consul has no leader")
	default:
		h.lastOK.Store(h.clock.Now().UnixNano())
		h.lastErr.Store("")
	}
}

// Reachable reports whether the last success is at most grace old, and the
// last error otherwise.
func (h *Health) Reachable(grace time.Duration) (bool, string) {
	ok := h.lastOK.Load()
	if ok != 0 && h.clock.Since(time.Unix(0, ok)) <= grace {
		return true, ""
	}
	msg, _ := h.lastErr.Load().(string)
	if ok == 0 {
		return false, strings.TrimPrefix("no successful probe yet; "+msg, "; ")
	}
	since := h.clock.Since(time.Unix(0, ok)).Round(time.Millisecond)
	if msg == "" {
		return false, fmt.Sprintf("last answer %s ago", since)
	}
	return false, fmt.Sprintf("last answer %s ago; last error: %s", since, msg)
}
