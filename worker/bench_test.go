package worker

import (
	"fmt"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// Allocation benchmarks of the hot paths: the desired state of a Service
// (every look at it), the diff against what Consul holds (every look), and
// Notify (every Kubernetes event). Run with
//
//	go test -run '^$' -bench . -benchmem ./worker
//
// and compare allocs/op and B/op before and after a change: a regression
// here is a regression of the daemon's CPU and memory at scale.

func benchSvc(n int) *k8s.Service {
	eps := make([]k8s.Endpoint, n)
	for i := range eps {
		eps[i] = ready(fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), fmt.Sprintf("web-%d", i))
	}
	return newSvc(eps)
}

// benchCfg spreads the cluster over 100 nodes, so the diff's node lookups
// take the spread path (the default at 10,000 Services).
func benchCfg(b *testing.B) Config {
	cfg := testConfig(b)
	spread, err := cfg.Cluster.WithNodes(100)
	if err != nil {
		b.Fatal(err)
	}
	cfg.Cluster = spread
	return cfg
}

func BenchmarkDesired(b *testing.B) {
	for _, n := range []int{10, 100} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			svc, cfg := benchSvc(n), benchCfg(b)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Desired(svc, cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// ownedOf is what Consul holds when it agrees with desired.
func ownedOf(cfg Config, desired []consul.Instance) map[string]Held {
	owned := make(map[string]Held, len(desired))
	for i, in := range desired {
		owned[in.ID] = Hold(consul.Registered{Instance: in, Node: cfg.Cluster.NodeNameFor(in.ID), ServiceIndex: uint64(i + 1), CheckIndex: uint64(i + 1), HasCheck: true})
	}
	return owned
}

func BenchmarkDiff(b *testing.B) {
	for _, n := range []int{10, 100} {
		cfg := benchCfg(b)
		spec, err := Desired(benchSvc(n), cfg)
		if err != nil {
			b.Fatal(err)
		}
		nodeOf, mark := cfg.Cluster.NodeNameFor, MarkOf(cfg.Cluster)
		b.Run(fmt.Sprintf("in-sync/instances=%d", n), func(b *testing.B) {
			owned := ownedOf(cfg, spec.Instances)
			b.ReportAllocs()
			for b.Loop() {
				if ch := Diff(spec.Instances, owned, nodeOf, mark); !ch.Empty() {
					b.Fatal("in sync, yet a change")
				}
			}
		})
		b.Run(fmt.Sprintf("one-changed/instances=%d", n), func(b *testing.B) {
			owned := ownedOf(cfg, spec.Instances)
			r := owned[spec.Instances[0].ID]
			r.Check.Status = consul.StatusCritical
			owned[r.ID] = r
			b.ReportAllocs()
			for b.Loop() {
				if ch := Diff(spec.Instances, owned, nodeOf, mark); len(ch.Update) != 1 {
					b.Fatalf("%d updates, want 1", len(ch.Update))
				}
			}
		})
	}
}

func BenchmarkNotify(b *testing.B) {
	w := New(Options{Key: testKey, Config: testConfig(b), Lookup: (&fakeK8s{svc: benchSvc(10), selected: true}).lookup,
		Store: newFakeStore(b, testCluster(b)), OwnedKnown: true})
	b.ReportAllocs()
	for b.Loop() {
		w.Notify() // not running: nothing drains the trigger, as for a worker that cannot flush
	}
}
