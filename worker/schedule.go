package worker

import (
	"time"

	"github.com/fleetsync/fleetsync/consul/backoff"
)

// flushJitter spreads the retries of workers that failed together (Consul
// away) over 80% to 120% of their backoff.
const flushJitter = 0.2

// scheduler holds the window rules; it is pure (times are passed in).
type scheduler struct {
	window                 time.Duration
	isolated               bool // the flush about to run is a leading edge
	dirty                  bool
	lastFlush              time.Time // completion of the last flush; zero: never
	failures               int
	retryAt                time.Time
	minBackoff, maxBackoff time.Duration
}

// wait returns how long until a pending change may be flushed: 0 at once.
// Leading edge: at least W since the last flush means now. Otherwise the
// flush waits for the end of the window that started when the last flush
// completed; after failures, for the backoff too.
func (s *scheduler) wait(now time.Time) time.Duration {
	next := s.lastFlush.Add(s.window)
	if s.failures > 0 && s.retryAt.After(next) {
		next = s.retryAt
	}
	if s.lastFlush.IsZero() && s.failures == 0 {
		return 0
	}
	return next.Sub(now)
}

func (s *scheduler) flushed(now time.Time, err error) {
	s.lastFlush = now
	if err == nil {
		s.failures = 0
		return
	}
	s.failures++
	p := backoff.Policy{Min: s.minBackoff, Max: s.maxBackoff, Jitter: flushJitter}
	s.retryAt = now.Add(p.Delay(s.failures))
}

func (s *scheduler) state() State {
	if s.failures > 0 {
		return StateBackingOff
	}
	return StatePending
}
