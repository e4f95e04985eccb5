package supervisor

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/worker"
)

func fatalIf(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func countReasons(msgs []string, reason string) int {
	n := 0
	for _, m := range msgs {
		if strings.HasPrefix(m, reason+": ") {
			n++
		}
	}
	return n
}

// TestForeignChecksAreReported: a critical node check and a warning check
// under one of a's instances, registered by someone else, are seen by the
// reads the fleet makes anyway (the workers' anti-entropy passes): counted
// by kind and status, one Warning Event per Service concerned however
// many reads see them, a row per Service, a readiness problem each; they
// are never deleted; once gone (or passing), all of it clears.
func TestForeignChecksAreReported(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	a, b := k8s.Key{Namespace: "ns", Name: "a"}, k8s.Key{Namespace: "ns", Name: "b"}
	for key, ips := range map[k8s.Key][]string{a: {"10.2.0.1", "10.2.0.2"}, b: {"10.2.0.3"}} {
		svc := service(key.Namespace, key.Name, ips...)
		svc.Object = &corev1.Service{}
		w.services[key] = svc
	}
	close(w.synced)
	rep := &recordingReporter{}
	m := NewMetrics(prometheus.NewRegistry(), PerWorker{})
	f := startOptions(t, w, store, func(o *Options) { o.Metrics, o.Reporter = m, rep }, nil)
	f.waitFor(t, "three instances", func() bool { return store.count("") == 3 })
	gauge := func(kind, status string) float64 {
		return testutil.ToFloat64(m.foreignChecks.WithLabelValues(kind, status))
	}

	node := f.cluster.NodeName()
	aID := f.cluster.InstanceID("ns", "a", "10.2.0.1", 8080)
	fatalIf(t, store.twin.RegisterCheck(node, "_node_maintenance", "", api.HealthCritical))
	fatalIf(t, store.twin.RegisterCheck(node, "probe", aID, api.HealthWarning))
	for range 3 { // the same checks seen by several reads: told once
		f.sup.resyncAll()
		f.waitFor(t, "the checks reported", func() bool {
			return gauge(checkKindNode, consul.StatusCritical) == 1 && gauge(checkKindService, consul.StatusWarning) == 1 &&
				len(f.sup.Problems()) == 2 && countReasons(rep.got(), ReasonForeignCheck) == 3
		})
	}
	msgs := rep.got()
	if i := slices.IndexFunc(msgs, func(m string) bool { return strings.Contains(m, "probe under instance "+aID) }); i < 0 ||
		!strings.Contains(msgs[i], "is warning") || !strings.Contains(msgs[i], "never writes or deletes it") {
		t.Fatalf("no Event naming the check under %s: %q", aID, msgs)
	}
	if n := countReasons(msgs, ReasonForeignCheck); n != 3 { // a: both checks, b: the node check
		t.Fatalf("%d Events, want 3: %q", n, msgs)
	}
	rows := f.sup.ForeignChecks()
	if len(rows[a]) != 2 || len(rows[b]) != 1 || !strings.Contains(rows[b][0], "node check _node_maintenance on node "+node+" is critical") {
		t.Fatalf("rows %q", rows)
	}
	if p := f.sup.Problems(); !strings.Contains(p[0]+p[1], "_node_maintenance") || !strings.Contains(p[0]+p[1], "2 Service(s)") {
		t.Fatalf("problems %q", p)
	}

	// The service check passes: it stays counted and listed, but neither
	// keeps a's instance out nor the fleet unready; its coming back
	// critical is told again.
	fatalIf(t, store.twin.RegisterCheck(node, "probe", aID, api.HealthPassing))
	f.sup.resyncAll()
	f.waitFor(t, "the probe passing", func() bool {
		return gauge(checkKindService, consul.StatusPassing) == 1 && len(f.sup.Problems()) == 1
	})
	fatalIf(t, store.twin.RegisterCheck(node, "probe", aID, api.HealthCritical))
	f.sup.resyncAll()
	f.waitFor(t, "the probe critical again, told again", func() bool {
		return gauge(checkKindService, consul.StatusCritical) == 1 && countReasons(rep.got(), ReasonForeignCheck) == 4
	})

	// Not ours: nothing the fleet did removed them.
	checks, _, err := store.other.Health().Node(node, nil)
	if err != nil || !slices.ContainsFunc(checks, func(c *api.HealthCheck) bool { return c.CheckID == "_node_maintenance" }) ||
		!slices.ContainsFunc(checks, func(c *api.HealthCheck) bool { return c.CheckID == "probe" }) {
		t.Fatalf("the foreign checks are not all in the catalog any more (err %v)", err)
	}

	for _, id := range []string{"_node_maintenance", "probe"} {
		if _, err := store.other.Catalog().Deregister(&api.CatalogDeregistration{Node: node, CheckID: id}, nil); err != nil {
			t.Fatal(err)
		}
	}
	f.sup.resyncAll()
	f.waitFor(t, "the report cleared", func() bool {
		return gauge(checkKindNode, consul.StatusCritical) == 0 && gauge(checkKindService, consul.StatusCritical) == 0 &&
			len(f.sup.Problems()) == 0 && len(f.sup.ForeignChecks()) == 0
	})
	if n := countReasons(rep.got(), ReasonForeignCheck); n != 4 {
		t.Fatalf("%d Events after the checks went, want still 4", n)
	}
}

// TestForeignChecksSeenAtBootstrap: checks already there when the daemon
// starts are reported from the bootstrap read, before any worker reads.
func TestForeignChecksSeenAtBootstrap(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	key := k8s.Key{Namespace: "ns", Name: "web"}
	svc := service("ns", "web", "10.3.0.1")
	svc.Object = &corev1.Service{}
	w.services[key] = svc
	close(w.synced)
	in := store.cluster.Stamp(consul.Instance{ID: store.cluster.InstanceID("ns", "web", "10.3.0.1", 8080), Name: "web", Address: "10.3.0.1", Port: 8080,
		Meta: map[string]string{worker.MetaNamespace: "ns", worker.MetaService: "web"}})
	store.put(in, store.cluster.NodeName())
	fatalIf(t, store.twin.RegisterCheck(store.cluster.NodeName(), "_node_maintenance", "", api.HealthCritical))
	rep := &recordingReporter{}
	f := startOptions(t, w, store, func(o *Options) { o.Reporter = rep }, nil)
	f.waitFor(t, "the node check reported", func() bool {
		return len(f.sup.Problems()) == 1 && countReasons(rep.got(), ReasonForeignCheck) == 1 && len(f.sup.ForeignChecks()[key]) == 1
	})
}

// checkHooks hears the counted foreign checks.
type checkHooks struct {
	nopHooks
	counted chan []consul.ForeignCheck
}

func (h checkHooks) ForeignChecks(checks []consul.ForeignCheck) { h.counted <- checks }

// TestForeignChecksOfOtherShardsAreNotCounted: a replica that holds none
// of the shards sees, in its bootstrap read, the checks on every Service
// of the cluster; it counts and reports none of them (it never reads
// those Services again, so what it saw would go stale).
func TestForeignChecksOfOtherShardsAreNotCounted(t *testing.T) {
	w, store := newFakeWatcher(), newMemStore()
	svc := service("ns", "web", "10.4.0.1")
	svc.Object = &corev1.Service{}
	w.services[svc.Key] = svc
	close(w.synced)
	id := store.cluster.InstanceID("ns", "web", "10.4.0.1", 8080)
	store.put(store.cluster.Stamp(consul.Instance{ID: id, Name: "web", Address: "10.4.0.1", Port: 8080,
		Meta: map[string]string{worker.MetaNamespace: "ns", worker.MetaService: "web"}}), store.cluster.NodeName())
	fatalIf(t, store.twin.RegisterCheck(store.cluster.NodeName(), "_node_maintenance", "", api.HealthCritical))
	fatalIf(t, store.twin.RegisterCheck(store.cluster.NodeName(), "probe", id, api.HealthCritical))
	hooks := checkHooks{counted: make(chan []consul.ForeignCheck, 10)}
	rep := &recordingReporter{}
	sup := New(Options{Selector: Selector{Allow: []string{"*"}}, Worker: worker.Config{Cluster: store.cluster},
		Watcher: w, Store: store, Shards: 2, Reporter: rep, Hooks: Hooks{Consul: hooks}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case got := <-hooks.counted:
		if len(got) != 0 || len(store.ForeignChecks()) != 2 {
			t.Fatalf("counted %d of the %d checks the bootstrap read saw, want none: no Service here", len(got), len(store.ForeignChecks()))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no report of the foreign checks after bootstrap")
	}
	if p, msgs := sup.Problems(), rep.got(); len(p) != 0 || len(msgs) != 0 || len(sup.ForeignChecks()) != 0 {
		t.Fatalf("problems %q, events %q, rows %v: want none", p, msgs, sup.ForeignChecks())
	}
}
