package e2e

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/shard"
	"github.com/fleetsync/fleetsync/test/fixture"
)

var toK8sWorkerLine = regexp.MustCompile(`To-k8s worker (started|ended): .* service=(\S+)`)

// toK8sWorkers is the to-k8s units d runs a worker for now, by its debug
// log ("To-k8s worker started/ended"), sorted.
func toK8sWorkers(t *testing.T, d *fixture.Daemon) []string {
	t.Helper()
	b, err := os.ReadFile(d.LogPath)
	must(t, err)
	run := map[string]bool{}
	for _, m := range toK8sWorkerLine.FindAllStringSubmatch(string(b), -1) {
		run[m[2]] = m[1] == "started"
	}
	var out []string
	for k, on := range run {
		if on {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// TestToK8sShards: two replicas with --shards=4 and --to-k8s: every
// mirrored Service is mirrored; each unit's worker (and its health watch)
// runs on exactly the replica holding the unit's shard, the same shard as
// a Kubernetes Service of that name; a replica killed (-9) is taken over
// after the lease, and a change of a unit it held lands.
func TestToK8sShards(t *testing.T) {
	e := newEnv(t)
	const shards, services = 4, 12
	p := e.cluster + "h"
	var names []string
	for i := range services {
		n := fmt.Sprintf("%s-s%02d", p, i)
		names = append(names, n)
		vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.86.0.%d", i+1), n, n+"-1", "", 8080, "passing")
	}
	rs := &replicaSet{e: e, shards: shards, ds: map[string]*fixture.Daemon{}}
	for _, id := range []string{"r1", "r2"} {
		rs.ds[id] = e.daemonFor(e.cluster, []string{e.ns}, fmt.Sprintf("--shards=%d", shards), "--lease-namespace="+e.ns, "--replica-id="+id,
			"--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*")
	}
	for i, n := range names {
		e.waitSlices(n, fmt.Sprintf("%s-4-8080-0[IPv4:8080]: 10.86.0.%d=true/true/false", n, i+1))
	}
	var held map[string][]int
	eventually(t, 60*time.Second, "shards balanced and each unit's worker on its shard's holder only", func() error {
		s := rs.snap(e.ctx)
		if err := s.balanced(shards); err != nil {
			return err
		}
		held = s.held
		all := map[string]string{}
		for id, d := range rs.ds {
			for _, u := range toK8sWorkers(t, d) {
				if other, ok := all[u]; ok {
					return fmt.Errorf("%s runs on %s and %s", u, other, id)
				}
				all[u] = id
			}
		}
		for _, n := range names {
			k := shard.Of(k8s.Key{Namespace: e.ns, Name: n}, shards)
			id, ok := all[e.ns+"/"+n]
			if !ok || !slices.Contains(held[id], k) {
				return fmt.Errorf("%s (shard %d) runs on %q, which holds %v", n, k, id, held[id])
			}
		}
		return nil
	})
	e.quiet("two replicas, steady", 3*time.Second)

	// r1 killed: r2 takes its shards over after the lease; a change of a
	// unit r1 held lands.
	var moved string
	for _, n := range names {
		if slices.Contains(held["r1"], shard.Of(k8s.Key{Namespace: e.ns, Name: n}, shards)) {
			moved = n
			break
		}
	}
	must(t, rs.ds["r1"].Kill())
	i := slices.Index(names, moved)
	vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.86.0.%d", i+1), moved, moved+"-1", "", 8080, "critical")
	eventually(t, leaseDuration+30*time.Second, moved+" updated by r2", func() error {
		got, err := sliceView(e.ctx, t, e.ns, moved)
		if err != nil {
			return err
		}
		if want := fmt.Sprintf("%s-4-8080-0[IPv4:8080]: 10.86.0.%d=false/false/false", moved, i+1); got != want {
			return fmt.Errorf("have %q, want %q", got, want)
		}
		return nil
	})
}
