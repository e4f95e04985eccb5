package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/shard"
	"github.com/fleetsync/fleetsync/test/fixture"
)

// TestThawedReplicaSeesATakeoverNotALoss: two replicas, --shards 2; r1 is
// stopped (SIGSTOP) past its Lease, r2 takes r1's shard and writes two
// newer states of every Service. Resumed (SIGCONT), r1 finds the entries
// it witnessed rewritten: it learns from the Leases that the shard is r2's
// now and stops its workers, and reports no loss (no "Consul lost or
// rolled back data" log, fleetsync_consul_data_loss_detected_total 0).
// The catalog is exactly the last state.
func TestThawedReplicaSeesATakeoverNotALoss(t *testing.T) {
	e := newEnv(t)
	const services, eps = 8, 2
	names, _ := svcSet(t, e, "thaw", services, eps, 60)
	rs := &replicaSet{e: e, shards: 2, ds: map[string]*fixture.Daemon{}}
	// r1 writes a change at once only 5 minutes after its last write: what
	// it learns of r2's states when it resumes waits, so its loss check,
	// due at once, meets r2's writes first (a write of r1's would be
	// refused on the shard's fence, which hands the shard over too).
	r1 := e.daemonFor(e.cluster, []string{e.ns}, "--shards=2", "--lease-namespace="+e.ns, "--replica-id=r1", "--window=5m")
	rs.ds["r1"] = r1
	r2 := rs.start("r2")
	e.waitCount(consul.Client, services*eps, 60*time.Second)
	var held []string
	eventually(t, 40*time.Second, "2 replicas balanced, r1 syncing some of the Services", func() error {
		s := rs.snap(e.ctx)
		held = s.workers["r1"]
		if err := s.balanced(2); err != nil || len(held) == 0 {
			return fmt.Errorf("%s; r1 runs %v (%v)", s.counts(), held, err)
		}
		return nil
	})
	// The newest write of a replica is always one of its witnesses: a
	// Service created now in r1's shard makes r1's newest write one of
	// the shard r2 will take (r1's first writes were of both shards).
	var r1Shards struct{ Held []int }
	_, body, err := r1.Get(e.ctx, "/debug/shards", "")
	if err == nil {
		err = json.Unmarshal([]byte(body), &r1Shards)
	}
	if err != nil || len(r1Shards.Held) != 1 {
		t.Fatalf("r1's shards: %s (%v)", body, err)
	}
	ports := map[string]int32{"http": 80}
	last := ""
	for i := 0; last == ""; i++ {
		if name := fmt.Sprintf("thaw-x%d", i); shard.Of(k8s.Key{Namespace: e.ns, Name: name}, 2) == r1Shards.Held[0] {
			last = name
		}
	}
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, last, map[string]string{optIn: "true"}, ports)))
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, last, last+"-stable", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(60+services, 0, eps))))
	names = append(names, last)
	e.waitCount(consul.Client, (services+1)*eps, 30*time.Second)

	log := func() string {
		b, err := os.ReadFile(r1.LogPath)
		must(t, err)
		return string(b)
	}
	lostBefore := strings.Count(log(), "Shard lost") // handed over to balance at start
	must(t, r1.Signal(syscall.SIGSTOP))
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = r1.Signal(syscall.SIGCONT)
		}
	})
	stopped := time.Now()
	eventually(t, 2*leaseDuration+10*time.Second, "r2 holds both shards", func() error {
		var sh struct{ Held []int }
		_, body, err := r2.Get(e.ctx, "/debug/shards", "")
		if err == nil {
			err = json.Unmarshal([]byte(body), &sh)
		}
		if err != nil || len(sh.Held) != 2 {
			return fmt.Errorf("r2 holds %v (%v)", sh.Held, err)
		}
		return nil
	})
	t.Logf("r1 stopped; r2 took its shard %s later; r1 ran %v", time.Since(stopped).Round(100*time.Millisecond), held)

	// Two newer states of every Service, written by r2.
	var want, named map[string]bool
	for _, offset := range []int{10, 20} {
		var keys []string
		for i, name := range names {
			set := fixture.IPs(60+i, offset, eps)
			must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, name, name+"-stable", discoveryv1.AddressTypeIPv4, ports, set)))
			for _, ep := range set {
				keys = append(keys, fmt.Sprintf("%s/%s:80", name, ep.IP))
			}
		}
		want, named = keysOf(keys, names)
		waitExact(t, consul.Client, e.node(), want, named, 30*time.Second, fmt.Sprintf("the state at offset %d", offset))
	}

	resumed = true
	t.Logf("r1 resumed at %s, %s after it was stopped", time.Now().UTC().Format("15:04:05.000"), time.Since(stopped).Round(100*time.Millisecond))
	must(t, r1.Signal(syscall.SIGCONT))
	// r1 judged what it found: the shard let go, or (wrongly) a loss.
	eventually(t, 40*time.Second, "r1 lets the taken shard go", func() error {
		l := log()
		if n := strings.Count(l, "Shard lost"); n <= lostBefore && !strings.Contains(l, "Consul lost or rolled back data") {
			return fmt.Errorf("%d shards lost in r1's log, %d before it was stopped", n, lostBefore)
		}
		return nil
	})
	eventually(t, 40*time.Second, "2 replicas balanced again", func() error { return rs.snap(e.ctx).balanced(2) })
	for _, l := range strings.Split(log(), "\n") {
		if strings.Contains(l, "Consul lost or rolled back data") {
			t.Errorf("the thawed replica took the takeover for a loss: %s", l)
		}
		if strings.Contains(l, "Shard") || strings.Contains(l, "entries this worker wrote") || strings.Contains(l, "Evidence of a loss") {
			t.Logf("r1: %.300s", l)
		}
	}
	if n := sumMetric(scrape(t, r1), "fleetsync_consul_data_loss_detected_total"); n != 0 {
		t.Errorf("r1: fleetsync_consul_data_loss_detected_total = %v, want 0", n)
	}
	waitExact(t, consul.Client, e.node(), want, named, 30*time.Second, "after r1 resumed")
}

// sumMetric adds up every series of a metric.
func sumMetric(body, name string) float64 {
	var sum float64
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			var v float64
			fmt.Sscanf(l[strings.LastIndex(l, " ")+1:], "%g", &v)
			sum += v
		}
	}
	return sum
}
