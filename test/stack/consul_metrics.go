package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RaftApplyMetric is the Prometheus counter of Raft applies on the server.
const RaftApplyMetric = "consul_raft_apply"

// RaftApplies returns agent 0's running total of Raft applies (each one a
// replicated write; a catalog register, deregister or /v1/txn costs one),
// read from /v1/agent/metrics?format=prometheus. Only the leader counts
// them. It starts again from zero after a restart. A counter not yet
// emitted reads as 0.
func (c *Consul) RaftApplies() (float64, error) {
	return c.counter(context.Background(), RaftApplyMetric)
}

// metricsTry bounds one read of the metrics and metricsTries the reads:
// an agent busy serving a fleet's reads (a takeover of 10,000 Services
// reads 100,000 instances) can take over 10 s to answer one.
var metricsTry, metricsTries = 10 * time.Second, 4

func (c *Consul) counter(ctx context.Context, name string) (float64, error) {
	var err error
	for range metricsTries {
		var v float64
		if v, err = c.counterOnce(ctx, name); err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return v, err
		}
	}
	return 0, fmt.Errorf("%w (%d tries of %s)", err, metricsTries, metricsTry)
}

func (c *Consul) counterOnce(ctx context.Context, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, metricsTry)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.HTTPAddr+"/v1/agent/metrics?format=prometheus", nil)
	if err != nil {
		return 0, err
	}
	if c.opts.Token != "" {
		req.Header.Set("X-Consul-Token", c.opts.Token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("consul metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("consul metrics: HTTP %d", resp.StatusCode)
	}
	v, _, err := parsePromCounter(bufio.NewScanner(resp.Body), name)
	return v, err
}

// parsePromCounter sums the samples of metric name (all label sets) in the
// Prometheus text format. found is false when no sample was there.
func parsePromCounter(sc *bufio.Scanner, name string) (v float64, found bool, err error) {
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		switch {
		case strings.HasPrefix(rest, " "):
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				return 0, false, fmt.Errorf("malformed sample %q", line)
			}
			rest = rest[end+1:]
		default:
			continue // another metric with this prefix, e.g. consul_raft_apply_foo
		}
		fields := strings.Fields(rest) // value [timestamp]
		if len(fields) == 0 {
			return 0, false, fmt.Errorf("malformed sample %q", line)
		}
		f, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("sample %q: %w", line, err)
		}
		v += f
		found = true
	}
	return v, found, sc.Err()
}

// Counter returns the sum of every sample of metric name (all label sets)
// from agent 0's /v1/agent/metrics?format=prometheus.
func (c *Consul) Counter(name string) (float64, error) {
	return c.counter(context.Background(), name)
}

// CatalogTxns returns consul_fsm_txn_count, the transactions the state
// machine applied: fleetsync makes every catalog write as one /v1/txn, so
// this counts its catalog writes apart from other Raft applies (sessions and
// KV writes of its cluster-id claim are consul_fsm_session_count and
// consul_fsm_kvs_count).
func (c *Consul) CatalogTxns() (float64, error) {
	return c.counter(context.Background(), "consul_fsm_txn_count")
}
