package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// TestSteadyStateAndRestartWriteNothing: with Kubernetes and Consul in
// agreement, 30 s of idling and a restart of the daemon cost zero Raft
// applies, and no instance is ever missing while the daemon restarts. A
// Service deleted while the daemon is down is deregistered after it comes
// back.
func TestSteadyStateAndRestartWriteNothing(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	const services, perService = 20, 5
	ports := map[string]int32{"http": 80}
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, name, map[string]string{optIn: "true"}, ports)))
		must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, name, name+"-a", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(i, 0, perService))))
	}
	d := e.daemon()
	want := services * perService
	eventually(t, 30*time.Second, "all instances registered", func() error {
		n, err := fixture.NodeServiceCount(consul.Client, e.node())
		if err != nil || n != want {
			return fmt.Errorf("%d of %d instances (%v)", n, want, err)
		}
		return nil
	})

	before, txnsBefore, claimBefore := raftApplies(t), catalogTxns(t), claimWrites(t)
	idle := 30 * time.Second
	time.Sleep(idle) // a measurement interval, not synchronisation
	idleApplies, idleTxns, idleClaim := raftApplies(t)-before, catalogTxns(t)-txnsBefore, claimWrites(t)-claimBefore
	// Session and KV applies are claim bookkeeping (an earlier test's
	// killed daemon has its session expire, say); nothing else may happen.
	t.Logf("idle %s: %v catalog writes, %v Raft applies (%v of them sessions/KV)", idle, idleTxns, idleApplies, idleClaim)
	if idleTxns != 0 || idleApplies != idleClaim {
		t.Errorf("steady state: %v catalog writes and %v other Raft applies in %s, want 0", idleTxns, idleApplies-idleClaim, idle)
	}

	// Restart (SIGTERM, start again) while polling the catalog.
	before = raftApplies(t)
	txnsBefore, claimBefore = catalogTxns(t), claimWrites(t)
	minSeen := watchMinimum(t, e.node(), func() {
		must(t, d.Restart(ctx, false))
		must(t, d.WaitReady(ctx, 30*time.Second))
		code, body, err := d.Get(ctx, "/debug/workers", "text/plain")
		if err != nil || code != 200 {
			t.Fatalf("/debug/workers: %d %v", code, err)
		}
		t.Logf("after restart:\n%.600s", body)
	})
	restartApplies := raftApplies(t) - before
	restartTxns, restartClaim := catalogTxns(t)-txnsBefore, claimWrites(t)-claimBefore
	t.Logf("restart: %v catalog writes, %v Raft applies in all (%v of them the cluster-id claim: session destroyed, created, lock taken); fewest instances seen %d of %d",
		restartTxns, restartApplies, restartClaim, minSeen, want)
	if restartTxns != 0 || restartApplies != restartClaim || minSeen != want {
		t.Errorf("restart: %v catalog writes (want 0), %v Raft applies beyond the claim's (want 0), fewest instances %d (want %d)",
			restartTxns, restartApplies-restartClaim, minSeen, want)
	}

	// Kill -9, delete a Service while down, start: only its instances go.
	must(t, d.Kill())
	must(t, c.CoreV1().Services(e.ns).Delete(ctx, "svc-0", metav1.DeleteOptions{}))
	must(t, d.Restart(ctx, true))
	must(t, d.WaitReady(ctx, 30*time.Second))
	e.waitInstances("svc-0", "")
	e.waitInstances("svc-1", "10.1.0.1:80=passing,10.1.0.2:80=passing,10.1.0.3:80=passing,10.1.0.4:80=passing,10.1.0.5:80=passing")
	if n, _ := fixture.NodeServiceCount(consul.Client, e.node()); n != want-perService {
		t.Errorf("after deleting svc-0 while down: %d instances, want %d", n, want-perService)
	}
}

// watchMinimum runs action while polling the instance count of node and
// returns the smallest count seen.
func watchMinimum(t *testing.T, node string, action func()) int {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	minSeen := int(^uint(0) >> 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if n, err := fixture.NodeServiceCount(consul.Client, node); err == nil && n < minSeen {
				minSeen = n
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	action()
	// Keep watching a little after readiness: workers flush right after it.
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	return minSeen
}
