package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// metricDoc is one row of docs/metrics.md.
type metricDoc struct {
	typ    string
	labels []string
}

func readMetricsDoc(t *testing.T) map[string]metricDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "metrics.md"))
	must(t, err)
	out := map[string]metricDoc{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(fleetsync_[a-z0-9_]+)` \\| (\\w+) \\| ([a-z_, ]*) \\|").FindAllStringSubmatch(string(b), -1) {
		var labels []string
		for _, l := range strings.Split(m[3], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		out[m[1]] = metricDoc{typ: m[2], labels: labels}
	}
	if len(out) < 20 {
		t.Fatalf("read only %d metrics from docs/metrics.md", len(out))
	}
	return out
}

// TestGrafanaDashboard checks deploy/grafana/fleetsync-dashboard.json:
// importable (valid JSON, uid, panels on the grid, a data source variable),
// every query on metrics and labels that docs/metrics.md lists, every
// listed metric on some panel, and every variable defined.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "fleetsync-dashboard.json"))
	must(t, err)
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 || len(d.Panels) == 0 {
		t.Fatalf("dashboard uid %q, title %q, schemaVersion %d, %d panels", d.UID, d.Title, d.SchemaVersion, len(d.Panels))
	}
	vars := map[string]bool{"__rate_interval": true, "__range": true, "__interval": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range []string{"datasource", "job", "namespace", "service"} {
		if !vars[v] {
			t.Errorf("no %s variable", v)
		}
	}
	docs := readMetricsDoc(t)
	used := map[string]bool{}
	ids := map[int]bool{}
	type rect struct{ x, y, w, h int }
	var rects []rect
	metricRe := regexp.MustCompile(`fleetsync_[a-z0-9_]+`)
	byRe := regexp.MustCompile(`by \(([a-z_, ]+)\)`)
	varRe := regexp.MustCompile(`\$([a-zA-Z_]+)`)
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v off the 24-column grid", p.Title, g)
		}
		for _, r := range rects {
			if g.X < r.x+r.w && r.x < g.X+g.W && g.Y < r.y+r.h && r.y < g.Y+g.H {
				t.Errorf("panel %q overlaps another at %+v", p.Title, g)
			}
		}
		rects = append(rects, rect{g.X, g.Y, g.W, g.H})
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %+v, %d targets; want ${datasource} and queries", p.Title, p.Datasource, len(p.Targets))
		}
		for _, tg := range p.Targets {
			e := tg.Expr
			if !balanced(e) {
				t.Errorf("panel %q: unbalanced brackets or quotes in %s", p.Title, e)
			}
			labels := map[string]bool{"le": true, "job": true, "instance": true}
			for _, name := range metricRe.FindAllString(e, -1) {
				base := name
				doc, ok := docs[name]
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if !ok && strings.HasSuffix(name, suffix) {
						base = strings.TrimSuffix(name, suffix)
						doc, ok = docs[base]
						if ok && doc.typ != "histogram" {
							ok = false
						}
					}
				}
				if !ok {
					t.Errorf("panel %q: %s is not in docs/metrics.md", p.Title, name)
					continue
				}
				used[base] = true
				for _, l := range doc.labels {
					labels[l] = true
				}
			}
			for _, m := range byRe.FindAllStringSubmatch(e, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); !labels[l] {
						t.Errorf("panel %q: groups by label %q that its metrics do not have: %s", p.Title, l, e)
					}
				}
			}
			for _, m := range varRe.FindAllStringSubmatch(e, -1) {
				if !vars[m[1]] {
					t.Errorf("panel %q: undefined variable $%s", p.Title, m[1])
				}
			}
		}
	}
	var unused []string
	for name := range docs {
		if !used[name] {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	if len(unused) > 0 {
		t.Errorf("metrics on no panel: %v", unused)
	}
}

// balanced reports whether (), {} and [] nest and quotes close.
func balanced(s string) bool {
	var stack []rune
	inQuote := false
	for _, r := range s {
		if r == '"' {
			inQuote = !inQuote
			continue
		}
		if inQuote {
			continue
		}
		switch r {
		case '(', '{', '[':
			stack = append(stack, r)
		case ')', '}', ']':
			open := map[rune]rune{')': '(', '}': '{', ']': '['}[r]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inQuote
}
