package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The benchmark itself needs the servers; these cover its pure parts.

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{name: "defaults", check: func(t *testing.T, o options) {
			if o.services != 1000 || o.endpoints != 10 || o.latencySamples != 200 || o.churnServices != 1000 ||
				o.churnFor != time.Minute || o.idle != time.Minute || o.rolloutEndpoints != 900 || o.inprocServices != 100000 ||
				o.inprocEndpoints != 1 || len(o.scenarios) != len(allScenarios) || o.out != "out/bench" {
				t.Errorf("defaults: %+v", o)
			}
		}},
		{name: "quick", args: []string{"--quick"}, check: func(t *testing.T, o options) {
			if o.services != 100 || o.endpoints != 5 || o.latencySamples != 20 || o.churnServices != 100 || o.churnFor != 10*time.Second {
				t.Errorf("quick: %+v", o)
			}
		}},
		{name: "explicit sizes win over quick", args: []string{"--quick", "--services=300", "--latency-samples=7"}, check: func(t *testing.T, o options) {
			if o.services != 300 || o.latencySamples != 7 || o.churnServices != 100 {
				t.Errorf("explicit: %+v", o)
			}
		}},
		{name: "scenario list", args: []string{"--scenarios=latency, rollout"}, check: func(t *testing.T, o options) {
			if !o.has("latency") || !o.has("rollout") || o.has("churn") || !o.needsKube() {
				t.Errorf("scenarios: %v", o.scenarios)
			}
		}},
		{name: "in-process only needs no API server", args: []string{"--scenarios=inprocess"}, check: func(t *testing.T, o options) {
			if o.needsKube() {
				t.Error("inprocess alone should not need the API server")
			}
		}},
		{name: "unknown scenario", args: []string{"--scenarios=speed"}, wantErr: "unknown scenario"},
		{name: "churn larger than the fleet", args: []string{"--services=10", "--churn-services=20"}, wantErr: "--churn-services"},
		{name: "rollout not a multiple of 25", args: []string{"--rollout-endpoints=30"}, wantErr: "multiple of 25"},
		{name: "stray argument", args: []string{"now"}, wantErr: "unexpected arguments"},
		{name: "render with nowhere to write", args: []string{"--render-from=out/bench/results.json"}, wantErr: "needs --performance-doc"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseFlags(c.args)
			switch {
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
			case c.wantErr == "" && err != nil:
				t.Fatalf("err = %v", err)
			}
			if c.check != nil {
				c.check(t, o)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	s := sortedCopy([]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	for _, c := range []struct{ p, want float64 }{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {0, 1}} {
		if got := percentile(s, c.p); got != c.want {
			t.Errorf("p%.0f = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("percentile of nothing = %v, want NaN", got)
	}
}

func TestFormatValue(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{0, "0"}, {1002, "1,002"}, {-1234567, "-1,234,567"}, {9836.4, "9,836.4"}, {13.625, "13.62"}, {0.0304, "0.0304"}} {
		if got := formatValue(c.v); got != c.want {
			t.Errorf("formatValue(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}

func TestConsulWritesBreakdown(t *testing.T) {
	w := consulWrites{total: 1005, txn: 1000, session: 1, kvs: 1}.minus(consulWrites{})
	if got, want := w.breakdown(), "1000 catalog transactions + 2 session/KV (cluster-id claim) + 3 other"; got != want {
		t.Errorf("breakdown = %q, want %q", got, want)
	}
}

func TestConsulRequests(t *testing.T) {
	before, err := parseConsulRequests(strings.NewReader(`# TYPE consul_api_http summary
consul_api_http_sum 0
consul_api_http_count 0
consul_api_http{method="PUT",path="v1_txn",quantile="0.5"} 3.5
consul_api_http_sum{method="PUT",path="v1_txn"} 4000
consul_api_http_count{method="PUT",path="v1_txn"} 10
consul_api_http_sum{method="GET",path="v1_catalog_nodes"} 2
consul_api_http_count{method="GET",path="v1_catalog_nodes"} 4
`))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseConsulRequests(strings.NewReader(`consul_api_http_sum{method="PUT",path="v1_txn"} 10000
consul_api_http_count{method="PUT",path="v1_txn"} 25
consul_api_http_sum{method="GET",path="v1_catalog_nodes"} 2
consul_api_http_count{method="GET",path="v1_catalog_nodes"} 4
consul_api_http_sum{method="GET",path="v1_health_service_"} 1500
consul_api_http_count{method="GET",path="v1_health_service_"} 3
`))
	if err != nil {
		t.Fatal(err)
	}
	d := after.minus(before)
	if d.total() != 18 {
		t.Errorf("total %v, want 18 (15 txns + 3 reads; the unmoved path left out)", d.total())
	}
	if got, want := d.String(), "PUT v1_txn 15 (6.00 s), GET v1_health_service_ 3 (1.50 s)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestParseKubeWrites(t *testing.T) {
	raw := []byte(`# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",group="discovery.k8s.io",resource="endpointslices",scope="resource",subresource="",verb="POST",version="v1"} 12
apiserver_request_total{code="200",component="apiserver",group="",resource="services",scope="resource",subresource="",verb="PUT",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="",resource="services",scope="resource",subresource="",verb="APPLY",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",group="",resource="events",scope="resource",subresource="",verb="PATCH",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",group="discovery.k8s.io",resource="endpointslices",scope="namespace",subresource="",verb="LIST",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",group="",resource="services",scope="resource",subresource="",verb="WATCH",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 50
apiserver_request_total{code="200",component="apiserver",group="",resource="services",scope="resource",subresource="",verb="DELETE",version="v1"} 4
`)
	if got := parseKubeWrites(raw); got != 22 {
		t.Fatalf("parseKubeWrites = %v, want 22 (12 POST + 3 PUT + 2 APPLY + 1 PATCH + 4 DELETE of services, endpointslices and events)", got)
	}
}
