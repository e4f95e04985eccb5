package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// TestToK8sMaxWatches: with --to-k8s-max-watches=1 and three mirrored
// services, one health query blocks and two poll; every service is
// mirrored, and a check change on any of them reaches its slice within
// the poll interval whether its worker holds the slot or polls.
func TestToK8sMaxWatches(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "w"
	names := []string{p + "-a", p + "-b", p + "-c"}
	for i, n := range names {
		vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.78.0.%d", i+1), n, fmt.Sprintf("%s-i%d", p, i), "", 8080, "passing")
	}
	d := e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*",
		"--to-k8s-max-watches=1", "--to-k8s-poll-interval=500ms")
	for i, n := range names {
		e.waitSlices(n, fmt.Sprintf("%s-4-8080-0[IPv4:8080]: 10.78.0.%d=true/true/false", n, i+1))
	}
	eventually(t, 10*time.Second, "one blocking query, two polling", func() error {
		body := scrape(t, d)
		b := metricValue(body, `fleetsync_tok8s_health_watches{mode="blocking"}`)
		q := metricValue(body, `fleetsync_tok8s_health_watches{mode="polling"}`)
		if b != 1 || q != 2 {
			return fmt.Errorf("blocking %v, polling %v", b, q)
		}
		return nil
	})
	for i, n := range names {
		vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.78.0.%d", i+1), n, fmt.Sprintf("%s-i%d", p, i), "", 8080, "critical")
		start := time.Now()
		e.waitSlices(n, fmt.Sprintf("%s-4-8080-0[IPv4:8080]: 10.78.0.%d=false/false/false", n, i+1))
		// The window (1 s, leading edge) and one poll interval, with room
		// for a loaded machine.
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s: check change in its slice after %s", n, took)
		}
	}
	if polls := metricValue(scrape(t, d), "fleetsync_tok8s_health_polls_total"); polls == 0 {
		t.Errorf("no polls counted past the cap")
	}
	if logs, err := os.ReadFile(d.LogPath); err != nil || !strings.Contains(string(logs), "more services than --to-k8s-max-watches") {
		t.Errorf("the cap was reached without the log line (%v)", err)
	}
}

// TestToK8sChangeFeed: past --to-k8s-max-watches, with a poll interval of
// an hour, a polled service's check turning critical, passing again, and
// its node's check turning critical reach its slice at once: the change
// feed (one blocking query on the checks not passing) starts its poll.
func TestToK8sChangeFeed(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "f"
	names := []string{p + "-a", p + "-b", p + "-c"}
	vm := func(i int, status string) {
		vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.79.0.%d", i+1), names[i], fmt.Sprintf("%s-i%d", p, i), "", 8080, status)
	}
	view := func(i int, ready bool) string {
		return fmt.Sprintf("%s-4-8080-0[IPv4:8080]: 10.79.0.%d=%v/%v/false", names[i], i+1, ready, ready)
	}
	for i := range names {
		vm(i, "passing")
	}
	d := e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*",
		"--to-k8s-max-watches=1", "--to-k8s-poll-interval=1h")
	for i := range names {
		e.waitSlices(names[i], view(i, true))
	}
	timed := func(what string, i int, ready bool) {
		t.Helper()
		start := time.Now()
		e.waitSlices(names[i], view(i, ready))
		// The window (1 s, leading edge), with room for a loaded machine;
		// the poll is an hour away.
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s: %s in its slice after %s", names[i], what, took)
		}
	}
	for i := range names {
		vm(i, "critical")
		timed("check critical", i, false)
		vm(i, "passing")
		timed("check passing again", i, true)
	}
	// A node check: every instance on the node is not ready.
	for i := range names {
		node := fmt.Sprintf("%s-vm%d", p, i)
		if _, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: node, Address: fmt.Sprintf("10.79.0.%d", i+1), SkipNodeUpdate: true,
			Check: &consulapi.AgentCheck{Node: node, CheckID: "node-" + node, Name: "node", Status: "critical"}}, nil); err != nil {
			t.Fatal(err)
		}
		timed("node check critical", i, false)
	}
	body := scrape(t, d)
	if b := metricValue(body, `fleetsync_tok8s_health_watches{mode="blocking"}`); b != 1 {
		t.Errorf("%v blocking health queries, want 1", b)
	}
	// Two of the three services poll; each changed three times.
	if n := metricValue(body, "fleetsync_tok8s_health_nudged_polls_total"); n < 6 {
		t.Errorf("%v polls started by the change feed, want at least 6", n)
	}
}
