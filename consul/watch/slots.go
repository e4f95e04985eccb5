package watch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Consul refuses more than limits.http_max_conns_per_client (200 by
// default) connections from one address, and a blocking query holds one
// for its whole wait. Slots cap the health queries that block at once;
// a health query that finds no free slot does not block: it waits
// PollEvery and reads the service's current state (a query at index 0,
// answered at once), which Loop's index rules turn into a change or
// nothing. Slots are taken per query: a watcher whose query returns takes
// its slot again at once, so the services that first got a slot keep it,
// and a slot is a poller's (at its next poll) only once a watcher ends or
// fails. Every service is either watched or read at least every PollEvery.
type slots struct {
	max     int64
	every   time.Duration
	clock   clock.Clock
	reads   chan struct{}  // polls reading at once: polls take connections too
	jitter  func() float64 // in [0, 1): spreads the polls of workers started together
	used    atomic.Int64   // blocking health queries in flight
	polling atomic.Int64   // health queries waiting for their poll
	polls   atomic.Int64   // polls read, in all
	once    sync.Once
	full    func() // told the first time no slot is free
}

// take reserves a slot for a blocking query; false when all are used.
func (s *slots) take() bool {
	for {
		n := s.used.Load()
		if n >= s.max {
			s.once.Do(func() {
				if s.full != nil {
					s.full()
				}
			})
			return false
		}
		if s.used.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (s *slots) free() { s.used.Add(-1) }

// wait waits the poll interval, 80 to 120 % of PollEvery so that workers
// started together do not poll together, then for one of the poll reads
// (false: ctx ended first). A true wait must be followed by done.
func (s *slots) wait(ctx context.Context) bool {
	s.polling.Add(1)
	defer s.polling.Add(-1)
	t := s.clock.NewTimer(time.Duration(float64(s.every) * (0.8 + 0.4*s.jitter())))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
	}
	select {
	case <-ctx.Done():
		return false
	case s.reads <- struct{}{}:
		s.polls.Add(1)
		return true
	}
}

// done ends a poll read that wait let through.
func (s *slots) done() { <-s.reads }

// WatchStats is what the health queries of a Client do now.
type WatchStats struct {
	Blocking int64 // blocking queries in flight (at most MaxWatches)
	Polling  int64 // queries waiting for their poll, past the cap
	Polls    int64 // polls read since the start
	Max      int64 // MaxWatches (0: no cap)
}

// Stats reports the health queries' slots.
func (c *Client) Stats() WatchStats {
	if c.slots == nil {
		return WatchStats{}
	}
	return WatchStats{Blocking: c.slots.used.Load(), Polling: c.slots.polling.Load(), Polls: c.slots.polls.Load(), Max: c.slots.max}
}
