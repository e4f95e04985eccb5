package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Figure is one measured number.
type Figure struct {
	Scenario string  `json:"scenario"`
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Note     string  `json:"note,omitempty"`
}

// Point is one sample of a series: seconds since the series' start and a
// value.
type Point struct {
	T float64 `json:"t"`
	V float64 `json:"v"`
}

// Results is what results.json holds.
type Results struct {
	Started     time.Time          `json:"started"`
	WallSeconds float64            `json:"wall_seconds"`
	Command     string             `json:"command"`
	Machine     Machine            `json:"machine"`
	Versions    map[string]string  `json:"versions"`
	Options     map[string]any     `json:"options"`
	Figures     []Figure           `json:"figures"`
	Series      map[string][]Point `json:"series,omitempty"`
	Latencies   []float64          `json:"latency_samples_seconds,omitempty"`
	Plots       []string           `json:"plots,omitempty"`
}

func newResults(o options) *Results {
	return &Results{
		Started:  time.Now().UTC().Truncate(time.Second),
		Command:  strings.Join(append([]string{"go run ./test/bench"}, os.Args[1:]...), " "),
		Machine:  readMachine(),
		Versions: map[string]string{"go": runtime.Version(), "fleetsync": gitState()},
		Options: map[string]any{
			"services": o.services, "endpoints": o.endpoints, "scenarios": o.scenarios, "quick": o.quick,
			"idle_seconds": o.idle.Seconds(), "latency_samples": o.latencySamples, "churn_services": o.churnServices,
			"churn_seconds": o.churnFor.Seconds(), "churn_budget_per_second": o.churnBudget, "memory_large": o.memoryLarge,
			"inprocess_services": o.inprocServices, "inprocess_endpoints": o.inprocEndpoints, "rollout_endpoints": o.rolloutEndpoints,
		},
		Series: map[string][]Point{},
	}
}

// add records a figure and prints its line.
func (r *Results) add(scenario, name string, value float64, unit, note string) {
	r.Figures = append(r.Figures, Figure{Scenario: scenario, Name: name, Value: value, Unit: unit, Note: note})
	line := fmt.Sprintf("  %-11s %-58s %14s %s", scenario, name, formatValue(value), unit)
	if note != "" {
		line += "  (" + note + ")"
	}
	fmt.Println(line)
}

func formatValue(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "n/a"
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return groupDigits(strconv.FormatInt(int64(v), 10))
	case math.Abs(v) >= 100:
		return groupDigits(strconv.FormatFloat(v, 'f', 1, 64))
	case math.Abs(v) >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default: // three significant digits
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// groupDigits puts thousands separators into the integer part.
func groupDigits(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if hasFrac {
		return sign + b.String() + "." + frac
	}
	return sign + b.String()
}

func (r *Results) path(dir string) string { return filepath.Join(dir, "results.json") }

func (r *Results) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(r.path(dir), append(b, '\n'), 0o644)
}

// percentile returns the p-th percentile (0..100) of sorted values, nearest
// rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func sortedCopy(v []float64) []float64 {
	out := append([]float64(nil), v...)
	sort.Float64s(out)
	return out
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Machine describes where the run happened.
type Machine struct {
	CPUs     int     `json:"cpus"`
	CPUModel string  `json:"cpu_model"`
	MemGiB   float64 `json:"mem_gib"`
	Kernel   string  `json:"kernel"`
	GOOS     string  `json:"goos"`
	GOARCH   string  `json:"goarch"`
	LoadAvg  string  `json:"loadavg_at_start"`
}

func readMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.MemGiB = math.Round(kb/1024/1024*10) / 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}

func (m Machine) summary() string {
	return fmt.Sprintf("%d CPUs (%s), %.1f GiB, Linux %s, %s, load %s", m.CPUs, m.CPUModel, m.MemGiB, m.Kernel, runtime.Version(), m.LoadAvg)
}

// gitState names the source the daemon was built from: the commit, and how
// many tracked files differ from it.
func gitState() string {
	rev, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	s := strings.TrimSpace(string(rev))
	st, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	if n := len(strings.Fields(strings.TrimSpace(string(st)))) / 2; n > 0 {
		s += fmt.Sprintf(" + %d modified files", n)
	}
	return s
}
