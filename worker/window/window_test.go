package window

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestSchedulerWait(t *testing.T) {
	tests := []struct {
		name string
		s    Schedule
		now  time.Duration // after t0
		want time.Duration // <= 0: at once
	}{
		{name: "never flushed", s: Schedule{Window: W}, want: 0},
		{name: "within the window", s: Schedule{Window: W, LastFlush: t0}, now: 300 * time.Millisecond, want: 700 * time.Millisecond},
		{name: "at the window end", s: Schedule{Window: W, LastFlush: t0}, now: W, want: 0},
		{name: "long after", s: Schedule{Window: W, LastFlush: t0}, now: time.Hour, want: W - time.Hour},
		{name: "window 0", s: Schedule{LastFlush: t0}, want: 0},
		{name: "backoff longer than W", s: Schedule{Window: W, LastFlush: t0, Failures: 1, RetryAt: t0.Add(3 * time.Second)}, now: W, want: 2 * time.Second},
		{name: "backoff shorter than W", s: Schedule{Window: W, LastFlush: t0, Failures: 1, RetryAt: t0.Add(200 * time.Millisecond)}, want: W},
		{name: "backoff with window 0", s: Schedule{LastFlush: t0, Failures: 3, RetryAt: t0.Add(time.Second)}, want: time.Second},
		{name: "old retryAt without failures ignored", s: Schedule{Window: W, LastFlush: t0, RetryAt: t0.Add(time.Hour)}, want: W},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.Wait(t0.Add(tt.now)); got != tt.want {
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
			s := Schedule{Window: W, MinBackoff: tt.min, MaxBackoff: tt.max}
			now := t0
			for n := 1; n <= 70; n++ {
				now = now.Add(time.Minute)
				s.Flushed(now, errTransient)
				base := time.Duration(math.Min(float64(tt.min)*math.Pow(2, float64(n-1)), float64(tt.max)))
				got := s.RetryAt.Sub(now)
				if s.Failures != n || got < base*8/10 || got > base*12/10 || !s.LastFlush.Equal(now) {
					t.Fatalf("after %d Failures: failures %d, backoff %v, want %v +-20%%", n, s.Failures, got, base)
				}
			}
			s.Flushed(now, nil)
			if s.Failures != 0 || s.Wait(now) != W {
				t.Errorf("after a success: %+v", s)
			}
		})
	}
}

const W = time.Second

var (
	t0           = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	errTransient = errors.New("500 leader lost")
)
