package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// scenarioText says in one sentence what each scenario measures, for the
// performance page.
var scenarioText = map[string]string{
	"cold-start": "fleetsync started against an empty Consul, every Service and EndpointSlice already in the API server.",
	"idle":       "Nothing changes: Consul writes and the daemon's CPU.",
	"memory":     "The converged daemon's memory, and the cost of one more Service when two sizes are measured.",
	"restart":    "SIGTERM, then a start with nothing changed: writes caused, time to ready, fewest instances seen in Consul.",
	"latency":    "Isolated changes, each to a quiet Service: EndpointSlice write returned to the change seen by a Consul blocking query (window not counted).",
	"rollout":    "One large Service rolled over like a Deployment, with the window at 0, 1 s and 5 s.",
	"churn":      "Many Services changing once a second under a global write budget.",
	"limit":      "Consul's own write limit for the same instances and nodes (raw transactions of fleetsync's shape, 8 in flight), and the cold start as a ratio of it (1.0: as fast as Consul takes the writes).",
	"replicas":   "Several replicas of one cluster with --shards: cold start, memory and CPU per replica, idle, one replica killed and its shards taken over.",
	"to-k8s":     "Consul -> Kubernetes (--to-k8s, default flags): the first mirror against a raw client with the same write budget, idle writes on both sides, a check change to the slice an informer sees, a burst of flips of one service, and one service of many instances.",
	"inprocess":  "The supervisor, workers and Consul client fed by an in-memory event source instead of the API server, against the real Consul.",

	"to-k8s-https": "Consul -> Kubernetes over Consul's HTTPS port, where Consul speaks HTTP/2 and the daemon lifts --to-k8s-max-watches (default flags): every health query blocking, the connections they share, idle reads, and a check change or an instance added / removed to the slice an informer sees.",
}

// renderPerformance renders the results of one run, or of several runs
// of different scenarios, as docs/performance.md: per run how it was made
// (command, machine, versions), then every figure, one table per scenario
// in the order they ran. The page holds the runs given: each rendering
// replaces it.
func renderPerformance(runs ...*Results) []byte {
	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Performance\n\n")
	p("<!-- Written by test/bench (make bench); every run replaces this page. Change test/bench/perfdoc.go, not this file. -->\n\n")
	if len(runs) == 1 {
		p("The figures of one `make bench` run: fleetsync built from `cmd/fleetsync` (without `-race`, default flags)\n")
	} else {
		p("The figures of %d `make bench` runs, each of the scenarios it names: fleetsync built from `cmd/fleetsync` (without `-race`, default flags)\n", len(runs))
	}
	p("against a real kube-apiserver with etcd and a real Consul, all on loopback of one machine, started by `test/stack`.\n")
	p("The machine is shared by every process of the run (the API server, etcd, Consul, fleetsync and the harness), so the\n")
	p("figures are this machine's; rerun the command to compare on yours. [sizing.md](sizing.md) turns them into what to give\n")
	p("a deployment; [design/README.md](design/README.md) says why the daemon is built the way these figures reward.\n")
	for _, r := range runs {
		renderRun(p, r, len(runs) > 1)
	}
	return b.Bytes()
}

// renderRun renders one run: how it was made, then its scenarios.
func renderRun(p func(string, ...any), r *Results, named bool) {
	var order []string
	for _, f := range r.Figures {
		if !slices.Contains(order, f.Scenario) {
			order = append(order, f.Scenario)
		}
	}
	if named {
		p("\n## How the figures of %s were made\n\n", strings.Join(order, ", "))
	} else {
		p("\n## How these figures were made\n\n")
	}
	p("```\n%s\n```\n\n", r.Command)
	p("| | |\n|---|---|\n")
	m := r.Machine
	p("| machine | %d CPUs (%s), %.1f GiB RAM, %s/%s, Linux %s |\n", m.CPUs, orDash(m.CPUModel), m.MemGiB, m.GOOS, m.GOARCH, orDash(m.Kernel))
	p("| load average at the start | %s |\n", orDash(m.LoadAvg))
	p("| Go | %s |\n", orDash(r.Versions["go"]))
	p("| fleetsync | %s |\n", orDash(r.Versions["fleetsync"]))
	var servers []string
	for _, k := range []string{"kube-apiserver", "consul"} {
		if v := r.Versions[k]; v != "" {
			servers = append(servers, k+" "+v)
		}
	}
	p("| servers | %s |\n", orDash(strings.Join(servers, ", ")))
	if n, ok := r.Options["services"]; ok {
		p("| size | %v Services x %v endpoints |\n", n, r.Options["endpoints"])
	}
	p("| wall time | %s |\n\n", time.Duration(r.WallSeconds*float64(time.Second)).Round(time.Second).String())
	p("`make bench` runs every scenario at its default sizes and writes this page; `make bench BENCH='...'` passes\n")
	p("flags (`go run ./test/bench --help` lists them). Every figure, and the raw series behind the plots, is also in\n")
	p("`results.json` of the run's `--out` directory; `--render-from` renders one or several of those into the page.\n")
	for _, sc := range order {
		p("\n## %s\n\n", sc)
		if t := scenarioText[sc]; t != "" {
			p("%s\n\n", t)
		}
		p("| figure | value | unit | note |\n|---|--:|---|---|\n")
		for _, f := range r.Figures {
			if f.Scenario == sc {
				p("| %s | %s | %s | %s |\n", cell(f.Name), formatValue(f.Value), cell(f.Unit), cell(f.Note))
			}
		}
	}
}

// cell makes text safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

// writePerformance replaces the file at path with the rendered results.
func writePerformance(path string, runs ...*Results) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, renderPerformance(runs...), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// renderFile renders the results.json files written by earlier runs
// (comma-separated, in the page's order) into path.
func renderFile(results, path string) error {
	var runs []*Results
	for _, f := range strings.Split(results, ",") {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r Results
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		runs = append(runs, &r)
	}
	return writePerformance(path, runs...)
}
