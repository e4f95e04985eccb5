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

	// The change feed's side (see feed.go): a poller of a service in the
	// Client's own scope registers a channel the feed nudges when the
	// service changed, from its wait until its read ends. A nudge that
	// comes while the poller reads makes it read again before it returns
	// (HealthQuery), so each poller of a name answers its own nudges and
	// nothing is kept for a poller that may never come. A nudge between
	// two polls of a worker (one returned, the next not yet waiting)
	// finds nobody: that service is read at its poll.
	mu      sync.Mutex
	waiting map[string]map[chan struct{}]struct{}
	nudged  atomic.Int64  // polls the feed started early
	started chan struct{} // closed at the first poll: the feed runs from then
	start   sync.Once
}

// enter registers a poller of name for nudges (nil: name is not in the
// Client's scope, only the poll interval wakes it).
func (s *slots) enter(name string, own bool) chan struct{} {
	s.start.Do(func() { close(s.started) })
	if !own {
		return nil
	}
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting[name] == nil {
		s.waiting[name] = map[chan struct{}]struct{}{}
	}
	s.waiting[name][ch] = struct{}{}
	return ch
}

// leave ends what enter began.
func (s *slots) leave(name string, ch chan struct{}) {
	if ch == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.waiting[name], ch)
	if len(s.waiting[name]) == 0 {
		delete(s.waiting, name)
	}
}

// renudged takes a nudge that came on ch since the last look (false: none,
// or ch is nil); a true renudged starts a read, counted as a nudged poll.
func (s *slots) renudged(ch chan struct{}) bool {
	select {
	case <-ch:
		s.nudged.Add(1)
		s.polls.Add(1)
		return true
	default:
		return false
	}
}

// nudge wakes the pollers of names.
func (s *slots) nudge(names map[string]struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range names {
		for ch := range s.waiting[n] {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
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
// started together do not poll together, or a nudge on nudged, then for
// one of the poll reads (false: ctx ended first). A true wait must be
// followed by done.
func (s *slots) wait(ctx context.Context, nudged chan struct{}) bool {
	s.polling.Add(1)
	defer s.polling.Add(-1)
	t := s.clock.NewTimer(time.Duration(float64(s.every) * (0.8 + 0.4*s.jitter())))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
	case <-nudged:
		s.nudged.Add(1)
	}
	if !s.read(ctx) {
		return false
	}
	s.polls.Add(1)
	return true
}

// read waits for one of the reads (false: ctx ended first); a true read
// must be followed by done.
func (s *slots) read(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case s.reads <- struct{}{}:
		return true
	}
}

// done ends a poll read that wait let through.
func (s *slots) done() { <-s.reads }

// WatchStats is what the health queries of a Client do now.
type WatchStats struct {
	Blocking int64 // blocking queries in flight (at most MaxWatches, when set)
	Polling  int64 // queries waiting for their poll, past the cap
	Polls    int64 // polls read since the start
	Nudged   int64 // polls the change feed started before their interval
	Max      int64 // MaxWatches (0: no cap)
}

// Stats reports the health queries' slots.
func (c *Client) Stats() WatchStats {
	if c.slots == nil {
		return WatchStats{Blocking: c.blocking.Load()}
	}
	return WatchStats{Blocking: c.slots.used.Load(), Polling: c.slots.polling.Load(), Polls: c.slots.polls.Load(), Nudged: c.slots.nudged.Load(), Max: c.slots.max}
}
