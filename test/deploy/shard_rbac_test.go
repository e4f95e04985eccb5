package deploy

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestShardedWithoutLeaseRBACStops runs a sharded replica with the
// unsharded chart's ServiceAccount (no Role on Leases) against the real API
// server: the Lease watch is forbidden, so the process exits with an error
// naming the Leases and their namespace, and /readyz never answers 200 (a
// replica that can hold no shard must not report ready).
func TestShardedWithoutLeaseRBACStops(t *testing.T) {
	needStack(t)
	consul := stack.ConsulT(t)
	ctx := t.Context()
	rel, ns, appNS, cluster := uniq("rbac-nolease"), uniq("fleetsync-nolease"), uniq("app"), uniq("nolease")
	createNamespace(t, ns)
	createNamespace(t, appNS)
	_, sa := installChartRBAC(t, chartProfiles[0], rel, ns)
	checkAccess(t, ns, sa, appNS, false)
	kubeconfig := saKubeconfig(t, ns, sa)

	d, err := fixture.SpawnDaemon(ctx, fixture.DaemonConfig{ClusterID: cluster, Kubeconfig: kubeconfig, ConsulAddr: consul.Addr,
		Namespaces: []string{appNS}, Name: "fleetsync-nolease",
		Args: []string{"--shards=2", "--lease-namespace=" + ns, "--replica-id=a"}})
	must(t, err)
	t.Cleanup(func() { d.CloseT(t) })

	err = d.WaitReady(ctx, 60*time.Second)
	if err == nil {
		t.Fatalf("a sharded replica without Lease RBAC reported ready:\n%s", d.LogTail(40))
	}
	if !d.Exited() {
		t.Fatalf("not ready but still running after 60 s (%v)", err)
	}
	if werr := d.Wait(); werr == nil {
		t.Error("fleetsync exited with status 0, want an error")
	}
	log, err := os.ReadFile(d.LogPath)
	must(t, err)
	last := string(log)
	if i := strings.LastIndex(last, "fleetsync:"); i >= 0 {
		last = last[i:]
	}
	if !strings.Contains(last, "watch the Leases in namespace "+ns) || !strings.Contains(last, "forbidden") {
		t.Errorf("the final error does not name the forbidden Lease watch and its namespace:\n%s", d.LogTail(20))
	}
}
