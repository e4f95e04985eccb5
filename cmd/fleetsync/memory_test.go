package main

import (
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestPlanMemory(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	limit := func(n int64, ok bool) func() (int64, bool) { return func() (int64, bool) { return n, ok } }
	cases := []struct {
		name  string
		env   map[string]string
		limit func() (int64, bool)
		want  memoryTuning
	}{
		{"defaults, no container limit", nil, limit(0, false), memoryTuning{GCPercent: 50, BootGCPercent: 150}},
		{"container limit of 1 GiB", nil, limit(1<<30, true), memoryTuning{GCPercent: 50, Limit: 966367641, BootGCPercent: 150}},
		{"operator's GOGC and GOMEMLIMIT win", map[string]string{"GOGC": "200", "GOMEMLIMIT": "300MiB"}, limit(1<<30, true), memoryTuning{GCPercent: -1, BootGCPercent: -1}},
	}
	for _, c := range cases {
		if got := planMemory(env(c.env), c.limit); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	for in, want := range map[string]int64{"max\n": 0, "536870912\n": 536870912, "9223372036854771712": 0, "garbage": 0, "0": 0} {
		if got, ok := parseMemoryLimit(in); got != want || ok != (want > 0) {
			t.Errorf("parseMemoryLimit(%q) = %d, %t; want %d", in, got, ok, want)
		}
	}
}

// TestReleaserReturnsMemoryOncePerBurst: after the bootstrap and a quiet
// spell the free heap is returned once; not before the fleet is
// bootstrapped, not while transactions go on, not again without a new
// one, and not when little is held.
func TestReleaserReturnsMemoryOncePerBurst(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	ready, free, released := false, uint64(100<<20), 0
	r := newReleaser(func() bool { return ready }, -1)
	r.clock, r.free, r.release = clk, func() uint64 { return free }, func() { released++ }
	step := func(d time.Duration, want int, what string) {
		t.Helper()
		clk.Step(d)
		r.check()
		if released != want {
			t.Fatalf("%s: %d releases, want %d", what, released, want)
		}
	}
	step(time.Minute, 0, "before the bootstrap")
	ready = true
	step(time.Second, 0, "at the bootstrap")
	step(9*time.Second, 0, "9 s after it")
	step(time.Second, 1, "10 s after it")
	r.active()
	step(5*time.Second, 1, "5 s after a transaction")
	r.active()
	step(9*time.Second, 1, "9 s after the last transaction")
	step(time.Second, 1, "quiet, but within 5 minutes of the last release")
	step(5*time.Minute, 2, "5 minutes after it: the burst's release")
	step(5*time.Minute, 2, "no transaction since")
	r.active()
	free = 1 << 20
	step(11*time.Second, 2, "after a burst that left 1 MiB free")
	step(5*time.Minute, 2, "and later: that burst is done with")
	r.active()
	free = 100 << 20
	step(11*time.Second, 3, "after the next burst")
	r.active()
	step(11*time.Second, 3, "after another burst within 5 minutes of the last release")
	step(5*time.Minute, 4, "5 minutes after the last release")
}

// TestQuietFleetHoldsLessHeap: once the fleet is bootstrapped, no
// transaction has been sent for 10 s and the heap grows by less than
// 1 MiB/s, the GC target drops to 10 %; a transaction or a faster growth
// (the first anti-entropy passes' reads) puts the daemon's back. With the
// operator's GOGC it is never touched.
func TestQuietFleetHoldsLessHeap(t *testing.T) {
	for _, busy := range []int{50, -1} {
		clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
		ready := false
		var allocs uint64
		var set []int
		r := newReleaser(func() bool { return ready }, busy)
		r.clock, r.free, r.release = clk, func() uint64 { return 0 }, func() {}
		r.setGC = func(p int) { set = append(set, p) }
		r.allocs = func() uint64 { return allocs }
		step := func(d time.Duration, rate uint64) {
			clk.Step(d)
			allocs += rate * uint64(d/time.Second)
			r.check()
		}
		step(time.Minute, 0) // not bootstrapped: the cold start keeps the busy target
		ready = true
		step(5*time.Second, 0) // the bootstrap: quiet counts from here
		step(5*time.Second, 0)
		if len(set) != 0 {
			t.Fatalf("gcBusy %d, 5 s after the bootstrap: GC targets set %v, want none yet", busy, set)
		}
		step(5*time.Second, 0) // quiet, allocating nothing
		r.active()             // a transaction
		step(5*time.Second, 0)
		r.active() // already busy: nothing to put back
		step(10*time.Second, 0)
		step(5*time.Second, 2<<20) // the first anti-entropy passes
		step(5*time.Second, 2<<20)
		step(5*time.Second, 100<<10)
		want := []int{quietGCPercent, busy, quietGCPercent, busy, quietGCPercent}
		if busy < 0 {
			want = nil
		}
		if !slices.Equal(set, want) {
			t.Errorf("gcBusy %d: GC targets set %v, want %v", busy, set, want)
		}
		if busy > 0 {
			// The free heap of the first passes goes back once
			// the target is quiet again, 5 minutes after the last release.
			released := 0
			r.free, r.release = func() uint64 { return 64 << 20 }, func() { released++ }
			step(5*time.Second, 2<<20)
			step(5*time.Minute, 2<<20)
			step(5*time.Second, 0)
			if released != 1 {
				t.Errorf("%d releases when the quiet target came back, want 1", released)
			}
		}
	}
}

// TestBootGCTargetEndsWithTheBootstrap: once the fleet is bootstrapped the
// daemon's GC target replaces the bootstrap's; the operator's GOGC is never
// touched, and a quiet target already set stays.
func TestBootGCTargetEndsWithTheBootstrap(t *testing.T) {
	var set []int
	r := newReleaser(func() bool { return true }, defaultGCPercent)
	r.setGC = func(p int) { set = append(set, p) }
	r.booted()
	if !slices.Equal(set, []int{defaultGCPercent}) {
		t.Fatalf("GC targets set at the bootstrap's end: %v, want [%d]", set, defaultGCPercent)
	}
	set = nil
	r.quietGC.Store(true)
	r.booted()
	if len(set) != 0 {
		t.Errorf("booted changed a quiet GC target: %v", set)
	}
	op := newReleaser(func() bool { return true }, -1) // the operator set GOGC
	op.setGC = func(p int) { set = append(set, p) }
	op.booted()
	if len(set) != 0 {
		t.Errorf("booted changed the operator's GC target: %v", set)
	}
}
