package window

import (
	"time"

	"github.com/fleetsync/fleetsync/consul/backoff"
)

// Jitter spreads the retries of workers that failed together (the remote
// end away) over 80% to 120% of their backoff.
const Jitter = 0.2

// Schedule holds one worker's window state; it is pure (times are passed
// in) and owned by the worker's goroutine.
type Schedule struct {
	Window                 time.Duration
	Dirty                  bool      // a change is pending
	LastFlush              time.Time // completion of the last flush; zero: never
	Failures               int       // consecutive failed flushes
	RetryAt                time.Time // earliest retry after a failure
	MinBackoff, MaxBackoff time.Duration
}

// Wait returns how long until a pending change may be flushed: <= 0 at
// once. Leading edge: at least Window since the last flush means now.
// Otherwise the flush waits for the end of the window that started when
// the last flush completed; after failures, for the backoff too.
func (s *Schedule) Wait(now time.Time) time.Duration {
	next := s.LastFlush.Add(s.Window)
	if s.Failures > 0 && s.RetryAt.After(next) {
		next = s.RetryAt
	}
	if s.LastFlush.IsZero() && s.Failures == 0 {
		return 0
	}
	return next.Sub(now)
}

// Flushed records a flush that completed at now with err.
func (s *Schedule) Flushed(now time.Time, err error) {
	s.LastFlush = now
	if err == nil {
		s.Failures = 0
		return
	}
	s.Failures++
	p := backoff.Policy{Min: s.MinBackoff, Max: s.MaxBackoff, Jitter: Jitter}
	s.RetryAt = now.Add(p.Delay(s.Failures))
}
