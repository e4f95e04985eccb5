package worker

import (
	"math"
	"testing"
	"time"
)

func TestSchedulerWait(t *testing.T) {
	tests := []struct {
		name string
		s    scheduler
		now  time.Duration // after t0
		want time.Duration // <= 0: at once
	}{
		{name: "never flushed", s: scheduler{window: W}, want: 0},
		{name: "within the window", s: scheduler{window: W, lastFlush: t0}, now: 300 * time.Millisecond, want: 700 * time.Millisecond},
		{name: "at the window end", s: scheduler{window: W, lastFlush: t0}, now: W, want: 0},
		{name: "long after", s: scheduler{window: W, lastFlush: t0}, now: time.Hour, want: W - time.Hour},
		{name: "window 0", s: scheduler{lastFlush: t0}, want: 0},
		{name: "backoff longer than W", s: scheduler{window: W, lastFlush: t0, failures: 1, retryAt: t0.Add(3 * time.Second)}, now: W, want: 2 * time.Second},
		{name: "backoff shorter than W", s: scheduler{window: W, lastFlush: t0, failures: 1, retryAt: t0.Add(200 * time.Millisecond)}, want: W},
		{name: "backoff with window 0", s: scheduler{lastFlush: t0, failures: 3, retryAt: t0.Add(time.Second)}, want: time.Second},
		{name: "old retryAt without failures ignored", s: scheduler{window: W, lastFlush: t0, retryAt: t0.Add(time.Hour)}, want: W},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.wait(t0.Add(tt.now)); got != tt.want {
				t.Errorf("wait = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSchedulerBackoff(t *testing.T) {
	tests := []struct {
		name     string
		min, max time.Duration
	}{
		{name: "defaults", min: 200 * time.Millisecond, max: 30 * time.Second},
		{name: "min equals max", min: time.Second, max: time.Second},
		{name: "large", min: time.Hour, max: 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := scheduler{window: W, minBackoff: tt.min, maxBackoff: tt.max}
			now := t0
			for n := 1; n <= 70; n++ {
				now = now.Add(time.Minute)
				s.flushed(now, errTransient)
				base := time.Duration(math.Min(float64(tt.min)*math.Pow(2, float64(n-1)), float64(tt.max)))
				got := s.retryAt.Sub(now)
				if s.failures != n || got < base*8/10 || got > base*12/10 || !s.lastFlush.Equal(now) {
					t.Fatalf("after %d failures: failures %d, backoff %v, want %v +-20%%", n, s.failures, got, base)
				}
			}
			s.flushed(now, nil)
			if s.failures != 0 || s.state() != StatePending || s.wait(now) != W {
				t.Errorf("after a success: %+v", s)
			}
		})
	}
}
