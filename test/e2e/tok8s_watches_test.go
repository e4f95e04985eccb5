package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
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
