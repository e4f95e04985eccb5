package backoff

import (
	"go/build"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func fixed(r float64) func() float64 { return func() float64 { return r } }

func TestDelay(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name string
		p    Policy
		want []time.Duration // Delay(1), Delay(2), ...
	}{
		{name: "doubles to max", p: Policy{Min: 200 * ms, Max: 2 * time.Second},
			want: []time.Duration{200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2 * time.Second, 2 * time.Second}},
		{name: "max not a power of two of min", p: Policy{Min: time.Second, Max: 30 * time.Second},
			want: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}},
		{name: "min equals max", p: Policy{Min: time.Second, Max: time.Second},
			want: []time.Duration{time.Second, time.Second, time.Second}},
		{name: "max below min is min", p: Policy{Min: time.Second, Max: time.Millisecond},
			want: []time.Duration{time.Second, time.Second}},
		{name: "no min: no wait", p: Policy{Max: time.Second},
			want: []time.Duration{0, 0}},
		{name: "zero policy", p: Policy{}, want: []time.Duration{0, 0}},
		{name: "jitter low end", p: Policy{Min: time.Second, Max: 4 * time.Second, Jitter: 0.2, Rand: fixed(0)},
			want: []time.Duration{800 * ms, 1600 * ms, 3200 * ms, 3200 * ms}},
		{name: "jitter middle", p: Policy{Min: time.Second, Max: 4 * time.Second, Jitter: 0.2, Rand: fixed(0.5)},
			want: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}},
		{name: "jitter high end passes max", p: Policy{Min: time.Second, Max: 4 * time.Second, Jitter: 0.5, Rand: fixed(0.75)},
			want: []time.Duration{1250 * ms, 2500 * ms, 5 * time.Second, 5 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := tt.p.Delay(0); d != 0 {
				t.Errorf("Delay(0) = %v, want 0", d)
			}
			for i, want := range tt.want {
				if got := tt.p.Delay(i + 1); got != want {
					t.Errorf("Delay(%d) = %v, want %v", i+1, got, want)
				}
			}
		})
	}
}

// TestDelayBounds: for any failure count, even one whose doubling would
// overflow, the wait before jitter is min(Min*2^(n-1), Max).
func TestDelayBounds(t *testing.T) {
	for _, p := range []Policy{
		{Min: 200 * time.Millisecond, Max: 30 * time.Second},
		{Min: time.Nanosecond, Max: math.MaxInt64},
		{Min: time.Hour, Max: 24 * time.Hour},
		{Min: math.MaxInt64 / 3, Max: math.MaxInt64},
	} {
		prev := time.Duration(0)
		for _, n := range []int{1, 2, 3, 10, 20, 40, 62, 63, 64, 65, 100, 1 << 20, math.MaxInt} {
			got := p.Delay(n)
			want := math.Min(float64(p.Min)*math.Pow(2, float64(n-1)), float64(p.Max))
			if got < prev || got > p.Max || got < p.Min || math.Abs(float64(got)-want) > want*1e-12 {
				t.Fatalf("%+v: Delay(%d) = %v after %v, want %.0fns (within [Min, Max], never falling)", p, n, got, prev, want)
			}
			prev = got
		}
		if prev != p.Max {
			t.Errorf("%+v: never reached Max (last %v)", p, prev)
		}
	}
}

// TestJitterRange: with Jitter j, every wait falls in [d(1-j), d(1+j)) for
// the unjittered d, and the draws spread over that range.
func TestJitterRange(t *testing.T) {
	const j = 0.2
	p := Policy{Min: time.Second, Max: 30 * time.Second, Jitter: j, Rand: rand.New(rand.NewPCG(1, 2)).Float64}
	for n := 1; n <= 8; n++ {
		d := Policy{Min: p.Min, Max: p.Max}.Delay(n)
		lo, hi := time.Duration(float64(d)*(1-j)), time.Duration(float64(d)*(1+j))
		var low, high bool
		for range 2000 {
			got := p.Delay(n)
			if got < lo || got >= hi {
				t.Fatalf("Delay(%d) = %v, want in [%v, %v)", n, got, lo, hi)
			}
			low = low || got < d*9/10
			high = high || got > d*11/10
		}
		if !low || !high {
			t.Errorf("Delay(%d): 2000 draws never fell below 90%% (%v) or above 110%% (%v) of %v", n, low, high, d)
		}
	}
}

func TestBackoffNextAndReset(t *testing.T) {
	b := New(Policy{Min: 100 * time.Millisecond, Max: time.Second})
	if b.Failures() != 0 {
		t.Fatalf("new: %d failures", b.Failures())
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	for i, w := range want {
		if got := b.Next(); got != w || b.Failures() != i+1 {
			t.Fatalf("Next #%d = %v (failures %d), want %v (failures %d)", i+1, got, b.Failures(), w, i+1)
		}
	}
	b.Reset()
	if b.Failures() != 0 {
		t.Errorf("after Reset: %d failures", b.Failures())
	}
	if got := b.Next(); got != 100*time.Millisecond {
		t.Errorf("Next after Reset = %v, want Min", got)
	}
	var zero Backoff // the zero Backoff: no wait, but counts
	if got := zero.Next(); got != 0 || zero.Failures() != 1 {
		t.Errorf("zero Backoff: Next = %v, failures %d", got, zero.Failures())
	}
}

// TestLeaf: the package imports nothing of the project, so that every
// package may use it without bending the dependency flow.
func TestLeaf(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/fleetsync/") {
			t.Errorf("imports %s", imp)
		}
	}
	if len(pkg.Imports) == 0 {
		t.Error("read no imports")
	}
}
