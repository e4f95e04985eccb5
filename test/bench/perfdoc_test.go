package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sampleResults() *Results {
	return &Results{
		WallSeconds: 754.4,
		Command:     "go run ./test/bench --performance-doc=docs/performance.md --services=2000",
		Machine:     Machine{CPUs: 2, CPUModel: "Example CPU @ 2.0GHz", MemGiB: 23.5, Kernel: "6.18.0", GOOS: "linux", GOARCH: "amd64", LoadAvg: "1.20 0.90 0.50"},
		Versions:    map[string]string{"go": "go1.26.8", "fleetsync": "abc1234", "consul": "1.14.11", "kube-apiserver": "v1.37.2"},
		Options:     map[string]any{"services": 2000, "endpoints": 10},
		Figures: []Figure{
			{Scenario: "cold-start", Name: "2,000 x 10: time to all 20,000 instances in Consul", Value: 6.53, Unit: "s", Note: "daemon spawn -> last instance seen"},
			{Scenario: "idle", Name: "Raft applies per minute", Value: 0, Unit: "applies/min", Note: "target 0"},
			{Scenario: "cold-start", Name: "instances per second", Value: 3063, Unit: "instances/s"},
			{Scenario: "memory", Name: "fleetsync RSS", Value: 72.6, Unit: "MiB", Note: "a | b\nc"},
		},
	}
}

func TestRenderPerformance(t *testing.T) {
	got := string(renderPerformance(sampleResults()))
	want := []string{
		"# Performance\n",
		"```\ngo run ./test/bench --performance-doc=docs/performance.md --services=2000\n```\n",
		"| machine | 2 CPUs (Example CPU @ 2.0GHz), 23.5 GiB RAM, linux/amd64, Linux 6.18.0 |\n",
		"| load average at the start | 1.20 0.90 0.50 |\n",
		"| Go | go1.26.8 |\n",
		"| fleetsync | abc1234 |\n",
		"| servers | kube-apiserver v1.37.2, consul 1.14.11 |\n",
		"| size | 2000 Services x 10 endpoints |\n",
		"| wall time | 12m34s |\n",
		// Figures of one scenario stay together, in the order they ran,
		// values formatted as the run printed them.
		"## cold-start\n\n" + scenarioText["cold-start"] + "\n\n| figure | value | unit | note |\n|---|--:|---|---|\n" +
			"| 2,000 x 10: time to all 20,000 instances in Consul | 6.53 | s | daemon spawn -> last instance seen |\n" +
			"| instances per second | 3,063 | instances/s |  |\n\n## idle\n",
		"| Raft applies per minute | 0 | applies/min | target 0 |\n",
		// A note cannot break the table.
		"| fleetsync RSS | 72.60 | MiB | a \\| b c |\n",
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("rendered page lacks %q; got:\n%s", w, got)
		}
	}
	if strings.Index(got, "## cold-start") > strings.Index(got, "## idle") || strings.Index(got, "## idle") > strings.Index(got, "## memory") {
		t.Errorf("scenarios not in the order they ran:\n%s", got)
	}
}

func TestRenderPerformanceWithoutMachineFacts(t *testing.T) {
	got := string(renderPerformance(&Results{Command: "go run ./test/bench", Versions: map[string]string{}}))
	for _, w := range []string{"| load average at the start | - |\n", "| servers | - |\n", "| fleetsync | - |\n"} {
		if !strings.Contains(got, w) {
			t.Errorf("rendered page lacks %q; got:\n%s", w, got)
		}
	}
	if strings.Contains(got, "| size |") {
		t.Errorf("size row without sizes:\n%s", got)
	}
}

// TestWritePerformanceReplaces: each run replaces the page, it never
// appends, and a results.json of an earlier run renders the same page.
func TestWritePerformanceReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "docs", "performance.md")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("# Old figures\nrun 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := sampleResults()
	if err := writePerformance(path, r); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(renderPerformance(r)) {
		t.Errorf("file is not the rendered page:\n%s", got)
	}
	if err := r.write(dir); err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(dir, "again.md")
	if err := renderFile(r.path(dir), again); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(again); string(b) != string(got) {
		t.Errorf("rendered from results.json:\n%s\nwant:\n%s", b, got)
	}
	if err := renderFile(filepath.Join(dir, "missing.json"), again); err == nil {
		t.Error("rendering a missing results.json succeeded")
	}
}

// TestRenderSeveralRuns: a page of two runs says how each was made, named
// by its scenarios, each followed by its own figures.
func TestRenderSeveralRuns(t *testing.T) {
	a := sampleResults()
	b := sampleResults()
	b.Command = "go run ./test/bench --scenarios=to-k8s"
	b.Figures = []Figure{{Scenario: "to-k8s", Name: "first mirror", Value: 98.26, Unit: "s"}}
	dir := t.TempDir()
	if err := a.write(filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	if err := b.write(filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(dir, "performance.md")
	if err := renderFile(a.path(filepath.Join(dir, "a"))+","+b.path(filepath.Join(dir, "b")), page); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	got := string(raw)
	order := []string{
		"The figures of 2 `make bench` runs",
		"## How the figures of cold-start, idle, memory were made\n\n```\n" + a.Command + "\n```",
		"## cold-start\n", "## memory\n",
		"## How the figures of to-k8s were made\n\n```\n" + b.Command + "\n```",
		"## to-k8s\n", "| first mirror | 98.26 | s |  |\n",
	}
	at := 0
	for _, w := range order {
		i := strings.Index(got[at:], w)
		if i < 0 {
			t.Fatalf("page lacks %q after offset %d:\n%s", w, at, got)
		}
		at += i + len(w)
	}
}
