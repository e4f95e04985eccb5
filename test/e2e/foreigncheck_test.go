package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// foreignGauge is fleetsync_consul_foreign_checks of kind and status.
func foreignGauge(body, kind, status string) float64 {
	return metricValue(body, fmt.Sprintf(`fleetsync_consul_foreign_checks{kind=%q,status=%q}`, kind, status))
}

// foreignRows returns the foreignChecks of every row of /debug/workers, by
// Service.
func foreignRows(t *testing.T, d *fixture.Daemon, ns string) (map[string][]string, error) {
	t.Helper()
	code, body, err := d.Get(t.Context(), "/debug/workers?namespace="+ns, "")
	if err != nil || code != 200 {
		return nil, fmt.Errorf("/debug/workers: %d %v", code, err)
	}
	var rows []struct {
		Service       string   `json:"service"`
		ForeignChecks []string `json:"foreignChecks"`
	}
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, r := range rows {
		if len(r.ForeignChecks) > 0 {
			out[r.Service] = r.ForeignChecks
		}
	}
	return out, nil
}

// checkIndexes returns the ModifyIndex of every check on node, by ID.
func checkIndexes(t *testing.T, node string) map[string]uint64 {
	t.Helper()
	checks, _, err := consul.Client.Health().Node(node, nil)
	must(t, err)
	out := map[string]uint64{}
	for _, c := range checks {
		out[c.CheckID] = c.ModifyIndex
	}
	return out
}

// TestForeignChecksAreReportedNeverTouched: someone else registers a
// critical `_node_maintenance` check on our node and a warning check under
// one of fc-0's instances, with the Consul API, as an operator or another
// tool would. fleetsync sees them through the reads it makes anyway (the
// workers' anti-entropy passes, every 2 s here): the metric counts them by
// kind and status, each Service concerned gets one Warning Event per check
// (not one per read), /debug/workers lists them on its rows, /readyz names
// them. They are never written or deleted by fleetsync; once their owner
// removes them, all of it clears.
func TestForeignChecksAreReportedNeverTouched(t *testing.T) {
	e := newEnv(t)
	names, keys := svcSet(t, e, "fc", 2, 2, 72)
	d := e.daemon("--resync-period=2s")
	e.waitCount(consul.Client, len(keys), 20*time.Second)
	must(t, d.WaitReady(e.ctx, 20*time.Second))
	ins, err := fixture.Instances(consul.Client, names[0], e.node())
	must(t, err)
	victim := ins[0].ID

	start := time.Now()
	for _, c := range []*consulapi.AgentCheck{
		{CheckID: "_node_maintenance", Name: "Node Maintenance Mode", Status: consulapi.HealthCritical, Notes: "kernel upgrade"},
		{CheckID: "probe", Name: "external probe", ServiceID: victim, Status: consulapi.HealthWarning, Output: "HTTP 503"},
	} {
		c.Node = e.node()
		_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: e.node(), Address: "127.0.0.1", SkipNodeUpdate: true, Check: c}, nil)
		must(t, err)
	}
	before := checkIndexes(t, e.node())

	eventually(t, 20*time.Second, "the foreign checks reported", func() error {
		body := scrape(t, d)
		if n, s := foreignGauge(body, "node", "critical"), foreignGauge(body, "service", "warning"); n != 1 || s != 1 {
			return fmt.Errorf("metric: node critical %v, service warning %v", n, s)
		}
		code, ready, err := d.Get(e.ctx, "/readyz", "")
		if err != nil || code != 503 || !strings.Contains(ready, "_node_maintenance") || !strings.Contains(ready, "probe under instance "+victim) {
			return fmt.Errorf("/readyz %d %q %v", code, ready, err)
		}
		rows, err := foreignRows(t, d, e.ns)
		if err != nil || len(rows[names[0]]) != 2 || len(rows[names[1]]) != 1 {
			return fmt.Errorf("/debug/workers rows %q (%v)", rows, err)
		}
		return nil
	})
	took := time.Since(start)
	events := func() (map[string]int, error) {
		list, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=ConsulForeignCheck"})
		if err != nil {
			return nil, err
		}
		out := map[string]int{}
		for _, ev := range list.Items {
			out[ev.InvolvedObject.Name] += int(ev.Count)
			if !strings.Contains(ev.Message, e.node()) || !strings.Contains(ev.Message, "never writes or deletes it") {
				return nil, fmt.Errorf("event message %q", ev.Message)
			}
		}
		return out, nil
	}
	eventually(t, 10*time.Second, "one Event per check and Service", func() error {
		got, err := events()
		if err != nil || got[names[0]] != 2 || got[names[1]] != 1 {
			return fmt.Errorf("ConsulForeignCheck events by Service %v (%v)", got, err)
		}
		return nil
	})
	// Several more passes read them again: no new Event, nothing touched.
	passes := metricValue(scrape(t, d), "fleetsync_fleet_antientropy_passes_total")
	eventually(t, 20*time.Second, "two more passes per worker", func() error {
		if n := metricValue(scrape(t, d), "fleetsync_fleet_antientropy_passes_total"); n < passes+4 {
			return fmt.Errorf("%v passes, want %v", n, passes+4)
		}
		return nil
	})
	if got, err := events(); err != nil || got[names[0]] != 2 || got[names[1]] != 1 {
		t.Fatalf("after more reads: events by Service %v (%v), want still 2 and 1", got, err)
	}
	after := checkIndexes(t, e.node())
	for _, id := range []string{"_node_maintenance", "probe"} {
		if after[id] == 0 || after[id] != before[id] {
			t.Fatalf("check %s: index %d before, %d after (0: gone): fleetsync touched someone else's check", id, before[id], after[id])
		}
	}

	// Their owner removes them: the report clears, the daemon is ready.
	for _, id := range []string{"_node_maintenance", "probe"} {
		_, err := consul.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: e.node(), CheckID: id}, nil)
		must(t, err)
	}
	eventually(t, 20*time.Second, "the report cleared", func() error {
		body := scrape(t, d)
		if n, s := foreignGauge(body, "node", "critical"), foreignGauge(body, "service", "warning"); n != 0 || s != 0 {
			return fmt.Errorf("metric: node critical %v, service warning %v", n, s)
		}
		if rows, err := foreignRows(t, d, e.ns); err != nil || len(rows) != 0 {
			return fmt.Errorf("/debug/workers rows %q (%v)", rows, err)
		}
		return nil
	})
	must(t, d.WaitReady(e.ctx, 10*time.Second))
	want, set := keysOf(keys, names)
	waitExact(t, consul.Client, e.node(), want, set, 10*time.Second, "our instances after the checks went")
	t.Logf("FIGURES %s: both checks reported %s after they were registered (--resync-period=2s); 3 Events, none repeated over 4 more passes; both checks untouched",
		t.Name(), took.Round(time.Millisecond))
}
