package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is the shape of a backoff. The zero Policy waits nothing.
type Policy struct {
	// Min is the wait after the first failure; <= 0 means no wait at all.
	Min time.Duration
	// Max bounds the wait before jitter; below Min it is taken as Min.
	Max time.Duration
	// Jitter is the half-width of the random factor, in [0, 1): 0.2 draws
	// the factor from [0.8, 1.2). 0 gives exact waits.
	Jitter float64
	// Rand returns a number in [0, 1) for the jitter (tests pass a fixed
	// one); nil uses math/rand/v2.
	Rand func() float64
}

// Delay returns the wait after the n-th consecutive failure; n < 1 gives 0.
func (p Policy) Delay(n int) time.Duration {
	if n < 1 || p.Min <= 0 {
		return 0
	}
	limit := max(p.Max, p.Min)
	d := p.Min
	// At most 63 doublings before d reaches limit (Min >= 1ns); checking
	// d > limit/2 first keeps d*2 from overflowing.
	for i := 1; i < n && d < limit; i++ {
		if d > limit/2 {
			d = limit
			break
		}
		d *= 2
	}
	d = min(d, limit)
	if p.Jitter <= 0 {
		return d
	}
	r := rand.Float64
	if p.Rand != nil {
		r = p.Rand
	}
	return time.Duration(float64(d) * (1 - p.Jitter + 2*p.Jitter*r()))
}

// Backoff counts consecutive failures under a Policy. The zero value of
// the counter is "no failure yet"; it is not safe for concurrent use.
type Backoff struct {
	Policy
	failures int
}

// New returns a Backoff with no failure yet.
func New(p Policy) *Backoff { return &Backoff{Policy: p} }

// Next records one more failure and returns the wait before the retry.
func (b *Backoff) Next() time.Duration {
	b.failures++
	return b.Delay(b.failures)
}

// Reset forgets the failures (after a success): the next wait is Min again.
func (b *Backoff) Reset() { b.failures = 0 }

// Failures is the number of failures since the last Reset.
func (b *Backoff) Failures() int { return b.failures }
