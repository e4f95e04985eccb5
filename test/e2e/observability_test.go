package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// scrape returns the daemon's /metrics as "name{labels} value" lines.
func scrape(t *testing.T, d *fixture.Daemon) string {
	t.Helper()
	code, body, err := d.Get(t.Context(), "/metrics", "")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	return body
}

// metricLine finds the first line starting with prefix.
func metricLine(body, prefix string) (string, bool) {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// TestMetricsAndDebugEndpoints: per-worker series appear, move on flushes,
// and vanish when the Service is deleted; /debug/workers reports the fleet.
func TestMetricsAndDebugEndpoints(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	d := e.daemon()
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "api", map[string]string{optIn: "true"}, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "api", "api-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(5, 0, 3))))
	e.waitInstances("api", "10.5.0.1:80=passing,10.5.0.2:80=passing,10.5.0.3:80=passing")

	lbl := fmt.Sprintf(`{namespace=%q,service="api"}`, e.ns)
	eventually(t, 5*time.Second, "per-worker series", func() error {
		body := scrape(t, d)
		for _, want := range []string{
			"fleetsync_worker_desired_instances" + lbl + " 3",
			"fleetsync_worker_registered_instances" + lbl + " 3",
			fmt.Sprintf(`fleetsync_worker_instance_writes_total{kind="register",namespace=%q,service="api"} 3`, e.ns),
			"fleetsync_worker_pending" + lbl + " 0",
			"fleetsync_worker_window_seconds" + lbl + " 1",
			"fleetsync_supervisor_bootstrapped 1",
			"fleetsync_k8s_informers_synced 1",
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("missing %q", want)
			}
		}
		if _, ok := metricLine(body, "fleetsync_worker_change_latency_seconds_count"+lbl); !ok {
			return fmt.Errorf("no latency histogram")
		}
		// The bootstrap's GC target (150) ended with it: the daemon's
		// (50), or the quiet one (10) after a quiet spell.
		if l, ok := metricLine(body, "go_gc_gogc_percent"); !ok || !(strings.HasSuffix(l, " 50") || strings.HasSuffix(l, " 10")) {
			return fmt.Errorf("GC target after the bootstrap: %q, want 50 (or the quiet 10)", l)
		}
		return nil
	})

	code, body, err := d.Get(ctx, "/debug/workers?namespace="+e.ns, "")
	if err != nil || code != 200 {
		t.Fatalf("/debug/workers: %d %v", code, err)
	}
	var ws []map[string]any
	must(t, json.Unmarshal([]byte(body), &ws))
	if len(ws) != 1 || ws[0]["service"] != "api" || ws[0]["state"] != "idle" || ws[0]["desired"] != float64(3) {
		t.Fatalf("/debug/workers = %s", body)
	}
	code, body, err = d.Get(ctx, "/debug/workers/"+e.ns+"/api", "")
	if err != nil || code != 200 || !strings.Contains(body, `"instances"`) || !strings.Contains(body, "10.5.0.3") {
		t.Fatalf("/debug/workers/%s/api: %d %v %s", e.ns, code, err, body)
	}
	if code, _, _ := d.Get(ctx, "/debug/workers/"+e.ns+"/nope", ""); code != http.StatusNotFound {
		t.Errorf("unknown worker: %d, want 404", code)
	}

	// Delete: the worker deregisters, stops, and its series vanish.
	must(t, c.CoreV1().Services(e.ns).Delete(ctx, "api", metav1.DeleteOptions{}))
	e.waitInstances("api", "")
	eventually(t, 5*time.Second, "series gone", func() error {
		body := scrape(t, d)
		if strings.Contains(body, lbl) {
			return fmt.Errorf("series of the deleted Service still exported")
		}
		if l, ok := metricLine(body, `fleetsync_fleet_instance_writes_total{kind="deregister"}`); !ok || strings.HasSuffix(l, " 0") {
			return fmt.Errorf("fleet deregister count: %q", l)
		}
		return nil
	})
}

// TestMetricsPerWorkerNone: no per-worker series, fleet-wide ones complete.
func TestMetricsPerWorkerNone(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	d := e.daemon("--metrics-per-worker=none")
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "api", map[string]string{optIn: "true"}, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "api", "api-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(6, 0, 2))))
	e.waitInstances("api", "10.6.0.1:80=passing,10.6.0.2:80=passing")
	eventually(t, 5*time.Second, "fleet metrics", func() error {
		body := scrape(t, d)
		if strings.Contains(body, "fleetsync_worker_") {
			return fmt.Errorf("per-worker series exported with --metrics-per-worker=none")
		}
		for _, want := range []string{
			`fleetsync_fleet_instance_writes_total{kind="register"} 2`,
			`fleetsync_fleet_workers{state="idle"} 1`,
			"fleetsync_fleet_flushes_total 1",
			"fleetsync_consul_txn_ops_total 7", // the claim's index and session checks, the node, 2 x (service, check)
			"fleetsync_fleet_change_latency_seconds_count 1",
			"fleetsync_supervisor_workers_started_total 1",
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("missing %q", want)
			}
		}
		return nil
	})
}

// TestReadyzFollowsBootstrapAndConsul: not ready while Consul cannot be
// read at start, ready once it can, not ready again when it has been gone
// longer than the grace period, ready when it is back.
func TestReadyzFollowsBootstrapAndConsul(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	must(t, own.Kill())

	d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
		ConsulAddr: own.Addr, Namespaces: []string{e.ns}, Args: []string{"--consul-unreachable-grace=2s"}})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })
	readyz := func(want int) func() error {
		return func() error {
			code, body, err := d.Get(context.Background(), "/readyz", "")
			if err != nil || code != want {
				return fmt.Errorf("/readyz = %d %q %v, want %d", code, strings.TrimSpace(body), err, want)
			}
			return nil
		}
	}
	eventually(t, 10*time.Second, "not ready without Consul", readyz(http.StatusServiceUnavailable))
	code, body, _ := d.Get(e.ctx, "/readyz", "")
	t.Logf("consul down at start: %d %s", code, strings.TrimSpace(body))
	if c, _, _ := d.Get(e.ctx, "/healthz", ""); c != http.StatusOK {
		t.Errorf("/healthz = %d while Consul is down, want 200", c)
	}
	must(t, own.Restart(e.ctx))
	eventually(t, 30*time.Second, "ready once Consul is back", readyz(http.StatusOK))
	must(t, own.Kill())
	eventually(t, 15*time.Second, "not ready after the grace period", readyz(http.StatusServiceUnavailable))
	code, body, _ = d.Get(e.ctx, "/readyz", "")
	t.Logf("consul gone mid-run: %d %s", code, strings.TrimSpace(body))
	must(t, own.Restart(e.ctx))
	eventually(t, 30*time.Second, "ready again", readyz(http.StatusOK))
}
