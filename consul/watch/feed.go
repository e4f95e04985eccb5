package watch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// feedStates are the check states the feed watches, one blocking query
// each (/v1/health/state/<state>). Consul indexes checks by status: such a
// query costs the server the checks in that state, and returns only when
// one of them appears, changes or leaves. A query on every check with a
// filter (state/any) would cost the server every check of the datacenter
// per read (42 ms for 50,000 checks, against 1 ms for the 50 critical
// ones) and return at every write of any check, passing ones included.
var feedStates = [...]string{api.HealthCritical, api.HealthWarning}

// The least time between the starts of two reads of one state is feedGap,
// and feedPerCheck per check in its last answer: checks not passing that
// change all the time cost at most 20 reads a second per state, and many
// checks not passing (an outage) answer that long at most every 200 ms
// per 10,000 checks.
const (
	feedGap      = 50 * time.Millisecond
	feedPerCheck = 20 * time.Microsecond
)

// Run is the change feed of the polled services; it returns when ctx ends
// (at once without MaxWatches). It starts with the first poll and holds
// one blocking query per state of feedStates (critical, which maintenance
// is too, and warning). A check that appears in an answer, changes (its
// ModifyIndex) or leaves it marks its service as changed; a node check
// marks every service on the node (read from the catalog). The pollers of
// a changed service in the Client's own scope read it at once instead of
// at their poll. So a check turning critical, warning or passing again,
// maintenance on or off, and an instance registered or deregistered with a
// check not passing reach a polled worker in milliseconds; an instance
// added or removed whose checks all pass, and an address or port change,
// wait for the poll. FeedError is told from the states' goroutines.
func (c *Client) Run(ctx context.Context) {
	s := c.slots
	if s == nil {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-s.started:
	}
	var wg sync.WaitGroup
	for _, state := range feedStates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := &feed{c: c, state: state}
			Loop(ctx, f.fetch, func(checks []*api.HealthCheck) { f.deliver(ctx, checks) },
				LoopOptions{Clock: s.clock, OnError: c.opts.FeedError})
		}()
	}
	wg.Wait()
}

type feedKey struct{ node, namespace, check string }

type feedCheck struct {
	service string // "" for a node check
	node    string
	modify  uint64
}

// feed holds one state's last answer; only its goroutine uses it.
type feed struct {
	c     *Client
	state string
	last  map[feedKey]feedCheck // nil before the first answer
	start time.Time             // of the last read
	// nodeFailures counts the answers in a row whose node reads failed.
	nodeFailures int
}

func (f *feed) fetch(ctx context.Context, index uint64) ([]*api.HealthCheck, uint64, error) {
	clk := f.c.slots.clock
	if gap := max(feedGap, time.Duration(len(f.last))*feedPerCheck) - clk.Since(f.start); !f.start.IsZero() && gap > 0 {
		t := clk.NewTimer(gap)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, ctx.Err()
		case <-t.C():
		}
	}
	f.start = clk.Now()
	checks, meta, err := ask(ctx, f.c, index, f.c.opts.MaxStale > 0, func(ctx context.Context, index uint64, stale bool) ([]*api.HealthCheck, *api.QueryMeta, error) {
		q, done := f.c.query(ctx, index, stale)
		checks, meta, err := f.c.api.Health().State(f.state, q)
		return checks, meta, done(err)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("consul checks %s: %w", f.state, err)
	}
	return checks, meta.LastIndex, nil
}

// deliver nudges the pollers of every service whose checks in the state
// differ from the last answer's. The first answer is only kept: every
// poller reads its service once at its start.
func (f *feed) deliver(ctx context.Context, checks []*api.HealthCheck) {
	now := make(map[feedKey]feedCheck, len(checks))
	for _, h := range checks {
		if h == nil {
			continue // Consul never sends these; a garbled answer must not crash us
		}
		now[feedKey{h.Node, h.Namespace, h.CheckID}] = feedCheck{service: h.ServiceName, node: h.Node, modify: h.ModifyIndex}
	}
	last := f.last
	f.last = now
	if last == nil {
		return
	}
	changed := map[string]struct{}{}
	nodes := map[string]struct{}{}
	mark := func(h feedCheck) {
		if h.service != "" {
			changed[h.service] = struct{}{}
		} else {
			nodes[h.node] = struct{}{}
		}
	}
	for k, h := range now {
		if was, ok := last[k]; !ok || was.modify != h.modify {
			mark(h)
		}
	}
	for k, h := range last {
		if _, ok := now[k]; !ok {
			mark(h)
		}
	}
	for n := range nodes {
		if err := f.servicesOn(ctx, n, changed); err != nil {
			// The pollers of this node and of the others left wait for
			// their poll: the other reads would fail too, each up to
			// ReadTimeout, while the feed reads nothing new.
			if ctx.Err() != nil {
				return
			}
			f.nodeFailures++
			if f.c.opts.FeedError != nil {
				f.c.opts.FeedError(err, f.nodeFailures)
			}
			break
		}
		f.nodeFailures = 0
	}
	if len(changed) > 0 {
		f.c.slots.nudge(changed)
	}
}

// servicesOn adds the names of node's services to into.
func (f *feed) servicesOn(ctx context.Context, node string, into map[string]struct{}) error {
	q, done := f.c.query(ctx, 0, f.c.opts.MaxStale > 0)
	l, _, err := f.c.api.Catalog().NodeServiceList(node, q)
	if err = done(err); err != nil {
		return fmt.Errorf("consul services of node %q: %w", node, err)
	}
	if l == nil {
		return nil // the node is gone: its services' pollers see that at their poll
	}
	for _, s := range l.Services {
		if s != nil {
			into[s.Service] = struct{}{}
		}
	}
	return nil
}
