package main

import "testing"

func TestPlanMemory(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	limit := func(n int64, ok bool) func() (int64, bool) { return func() (int64, bool) { return n, ok } }
	cases := []struct {
		name  string
		env   map[string]string
		limit func() (int64, bool)
		want  memoryTuning
	}{
		{"defaults, no container limit", nil, limit(0, false), memoryTuning{GCPercent: 50}},
		{"container limit of 1 GiB", nil, limit(1<<30, true), memoryTuning{GCPercent: 50, Limit: 966367641}},
		{"operator's GOGC and GOMEMLIMIT win", map[string]string{"GOGC": "200", "GOMEMLIMIT": "300MiB"}, limit(1<<30, true), memoryTuning{GCPercent: -1}},
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
