package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record string `json:"record"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

var recordingRulesPath = filepath.Join(chartDir, "files", "consul-k8s-recording-rules.yaml")

// consulK8sSeries are the to-Consul series consul-k8s's catalog sync
// exports (control-plane/catalog/to-consul/syncer.go: SyncToConsulCounters
// and SyncCatalogGauge, through go-metrics' Prometheus sink).
var consulK8sSeries = []string{
	"consul_sync_catalog_to_consul_deregister",
	"consul_sync_catalog_to_consul_deregister_error",
	"consul_sync_catalog_to_consul_register",
	"consul_sync_catalog_to_consul_register_error",
	"consul_sync_catalog_to_consul_status",
}

// TestConsulK8sRecordingRules: the recording rules produce each of
// consul-k8s's to-Consul series once, and every expression reads only
// metrics (and labels) that docs/metrics.md lists, so none silently
// records nothing.
func TestConsulK8sRecordingRules(t *testing.T) {
	b, err := os.ReadFile(recordingRulesPath)
	must(t, err)
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("%s: %v", recordingRulesPath, err)
	}
	docs := readMetricsDoc(t)
	var recorded []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			recorded = append(recorded, r.Record)
			for _, p := range exprProblems(r.Expr, docs) {
				t.Errorf("rule %s: %s", r.Record, p)
			}
		}
	}
	slices.Sort(recorded)
	if !slices.Equal(recorded, consulK8sSeries) {
		t.Errorf("recorded %q, want %q", recorded, consulK8sSeries)
	}
	// The control: the check finds what it is for.
	for expr, want := range map[string]string{
		`sum(fleetsync_fleet_instance_writes)`:                            "fleetsync_fleet_instance_writes is not",
		`consul_sync_catalog_to_consul_register`:                          "consul_sync_catalog_to_consul_register is not",
		`sum by (service) (fleetsync_fleet_flushes_total)`:                `label "service"`,
		`fleetsync_fleet_instance_writes_total{op="register"}`:            `label "op"`,
		`rate(fleetsync_consul_txn_duration_seconds_bucket[5m])`:          "",
		`sum without (kind) (rate(fleetsync_fleet_events_total[1m] ))`:    `label "kind"`,
		`fleetsync_supervisor_bootstrapped * (fleetsync_shard_held == 1)`: "",
	} {
		got := strings.Join(exprProblems(expr, docs), "; ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("exprProblems(%s) = %q, want %q", expr, got, want)
		}
	}
}

// promqlWords are the PromQL functions, aggregations and keywords the
// checked expressions may use.
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "rate": true, "increase": true, "irate": true,
	"histogram_quantile": true, "clamp_max": true, "clamp_min": true, "absent": true, "bool": true, "by": true,
	"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "and": true, "or": true,
	"unless": true, "offset": true, "vector": true, "scalar": true, "time": true,
}

// exprProblems lists the metric names in expr that docs does not list and
// the labels it matches or groups by that none of its metrics has. It
// reads PromQL by tokens: strings, ranges and label sets are taken apart,
// every other identifier is a function, a keyword or a metric.
func exprProblems(expr string, docs map[string]metricDoc) []string {
	var problems []string
	labels := map[string]bool{"job": true, "instance": true, "le": true}
	var used []string // labels matched or grouped by
	ident := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`)
	for i := 0; i < len(expr); {
		rest := expr[i:]
		switch {
		case rest[0] == '"':
			end := strings.IndexByte(rest[1:], '"')
			if end < 0 {
				return append(problems, "unclosed string")
			}
			i += end + 2
		case rest[0] == '[':
			i += strings.IndexByte(rest, ']') + 1
		case rest[0] == '{':
			end := strings.IndexByte(rest, '}')
			for _, m := range regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`).FindAllStringSubmatch(rest[:end], -1) {
				used = append(used, m[1])
			}
			i += end + 1
		case ident.MatchString(rest):
			w := ident.FindString(rest)
			i += len(w)
			if w == "by" || w == "without" || w == "on" || w == "ignoring" {
				open, end := strings.IndexByte(expr[i:], '('), strings.IndexByte(expr[i:], ')')
				for _, l := range strings.Split(expr[i+open+1:i+end], ",") {
					used = append(used, strings.TrimSpace(l))
				}
				i += end + 1
				continue
			}
			if promqlWords[w] {
				continue
			}
			doc, ok := docs[w]
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(w, suffix); !ok && cut {
					doc, ok = docs[base]
					ok = ok && doc.typ == "histogram"
				}
			}
			if !ok {
				problems = append(problems, w+" is not in docs/metrics.md")
				continue
			}
			for _, l := range doc.labels {
				labels[l] = true
			}
		default:
			i++
		}
	}
	for _, l := range used {
		if l != "" && !labels[l] {
			problems = append(problems, "label "+`"`+l+`"`+" is on none of the expression's metrics")
		}
	}
	return problems
}

// TestHelmConsulK8sRecordingRules: the chart's opt-in PrometheusRule holds
// the rule file's groups as they are, and passes a server-side dry run;
// without the value there is none.
func TestHelmConsulK8sRecordingRules(t *testing.T) {
	needStack(t)
	p := profile(t, "minimal")
	if o := p.render(t, "fs", "fleetsync"); len(o.ofKind("PrometheusRule")) != 0 {
		t.Fatal("a PrometheusRule without metrics.consulK8sRecordingRules.enabled")
	}
	p.values += "metrics: {consulK8sRecordingRules: {enabled: true, labels: {release: kube-prometheus}}}\n"
	ns := uniq("rules")
	o := p.render(t, "fs", ns)
	rules := o.ofKind("PrometheusRule")
	if len(rules) != 1 || rules[0].GetLabels()["release"] != "kube-prometheus" || rules[0].GetNamespace() != ns {
		t.Fatalf("PrometheusRules %v", rules)
	}
	b, err := os.ReadFile(recordingRulesPath)
	must(t, err)
	var want map[string]any
	must(t, yaml.Unmarshal(b, &want))
	if got := rules[0].Object["spec"]; !reflect.DeepEqual(got, want) {
		t.Errorf("PrometheusRule spec %v, want the rule file's %v", got, want)
	}

	installCRD(t, "prometheusrule-crd.yaml", "prometheusrules", "PrometheusRule")
	createNamespace(t, ns)
	out := kubectl(t, "apply", "--dry-run=server", "-f", writeFile(t, "rules.yaml", o.only("PrometheusRule").yaml(t)))
	if !strings.Contains(out, "prometheusrule.monitoring.coreos.com/fs-fleetsync-consul-k8s created (server dry run)") {
		t.Errorf("dry run: %s", out)
	}
}

// installCRD installs the trimmed CRD in testdata/file for plural.
func installCRD(t *testing.T, file, plural, kind string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	must(t, err)
	kubectl(t, "apply", "-f", writeFile(t, file, string(b)))
	kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+plural+".monitoring.coreos.com")
	eventually(t, 30*time.Second, kind+" kind served", func() error {
		list, err := kube.Client.Discovery().ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
		if err != nil {
			return err
		}
		for _, r := range list.APIResources {
			if r.Name == plural {
				return nil
			}
		}
		return fmt.Errorf("%s not served yet", plural)
	})
}
