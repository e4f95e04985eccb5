package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// writeLog records every write of a to-k8s object of one namespace, from
// a point on, as "kind/name op" (op: create, update, delete), in order.
type writeLog struct {
	mu  sync.Mutex
	ops []string
}

// k8sWriteLog starts a writeLog of e.ns from the current state: a watch of
// the marked Services and EndpointSlices from their lists' resourceVersion.
func (e *env) k8sWriteLog() *writeLog {
	e.t.Helper()
	l := &writeLog{}
	ctx, cancel := context.WithCancel(e.ctx)
	e.t.Cleanup(cancel)
	sel := "endpointslice.kubernetes.io/managed-by=to-k8s.fleetsync.io"
	sl, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	must(e.t, err)
	svcs, err := kube.Client.CoreV1().Services(e.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	must(e.t, err)
	sw, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: sl.ResourceVersion})
	must(e.t, err)
	vw, err := kube.Client.CoreV1().Services(e.ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: svcs.ResourceVersion})
	must(e.t, err)
	ops := map[watch.EventType]string{watch.Added: "create", watch.Modified: "update", watch.Deleted: "delete"}
	for kind, w := range map[string]watch.Interface{"slice": sw, "svc": vw} {
		go func() {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					op, known := ops[ev.Type]
					if !known {
						continue // bookmarks; an error ends in a missing write, which the test reports
					}
					m, ok := ev.Object.(metav1.Object)
					if !ok {
						continue
					}
					l.mu.Lock()
					l.ops = append(l.ops, kind+"/"+m.GetName()+" "+op)
					l.mu.Unlock()
				}
			}
		}()
	}
	return l
}

// sorted returns the writes so far, sorted.
func (l *writeLog) sorted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(slices.Values(l.ops))
}

// snapFleet is a test's own Consul agent (a restore is Consul-wide) and
// its services p-<i>, instance j (1-based) of service i at 10.89.i.j:8443
// on node p-vm<i>-<j>, mirrored into e.ns.
type snapFleet struct {
	e   *env
	own *stack.Consul
	p   string
}

const snapPort = 8443

func newSnapFleet(e *env, suffix string) *snapFleet {
	e.t.Helper()
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(e.t, err)
	e.t.Cleanup(func() { _ = own.Stop() })
	return &snapFleet{e: e, own: own, p: e.cluster + suffix}
}

func (f *snapFleet) name(i int) string { return fmt.Sprintf("%s-%d", f.p, i) }

func (f *snapFleet) register(i, j int, status string) {
	f.e.t.Helper()
	node, id := fmt.Sprintf("%s-vm%d-%d", f.p, i, j), fmt.Sprintf("%s-%d-%d", f.p, i, j)
	_, err := f.own.Client.Catalog().Register(&consulapi.CatalogRegistration{
		Node: node, Address: fmt.Sprintf("10.89.%d.%d", i, j), SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: id, Service: f.name(i), Port: snapPort},
		Checks:  consulapi.HealthChecks{{Node: node, CheckID: "check-" + id, Name: "check", Status: status, ServiceID: id}},
	}, nil)
	must(f.e.t, err)
}

func (f *snapFleet) deregister(i, j int) {
	f.e.t.Helper()
	_, err := f.own.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: fmt.Sprintf("%s-vm%d-%d", f.p, i, j)}, nil)
	must(f.e.t, err)
}

// slice is the name of service i's one slice.
func (f *snapFleet) slice(i int) string { return fmt.Sprintf("%s-4-%d-0", f.name(i), snapPort) }

// waitView waits until service i's slice holds its instances with the
// readiness ready[j-1], as sliceView shows it.
func (f *snapFleet) waitView(i int, ready ...bool) {
	f.e.t.Helper()
	var eps []string
	for j, r := range ready {
		eps = append(eps, fmt.Sprintf("10.89.%d.%d=%v/%v/false", i, j+1, r, r))
	}
	f.e.waitSlices(f.name(i), fmt.Sprintf("%s[IPv4:%d]: %s", f.slice(i), snapPort, strings.Join(eps, " ")))
}

// waitGone waits until service i's Service and slices are gone.
func (f *snapFleet) waitGone(i int) {
	f.e.t.Helper()
	e := f.e
	eventually(e.t, 20*time.Second, "mirrored Service "+f.name(i)+" deleted", func() error {
		if _, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, f.name(i), metav1.GetOptions{}); err == nil {
			return fmt.Errorf("service %s still there", f.name(i))
		}
		if s, err := sliceView(e.ctx, e.t, e.ns, f.name(i)); err != nil || s != "" {
			return fmt.Errorf("slices left: %q, %v", s, err)
		}
		return nil
	})
}

// TestToK8sSnapshotRestore: Consul restored from a snapshot taken before
// a service was deregistered, one added, a check turned critical and an
// instance added: fleetsync writes exactly the differences back (the
// service restored is created again, the one restored away deleted, the
// two changed slices updated once) and touches nothing of the unchanged
// services. The restore drops one of six mirrored services, below the
// mass-deletion guard's half: the plain path.
//
// What the watches see (Consul 1.14, logged below): Raft's index goes on,
// but the X-Consul-Index of each endpoint goes back to that of the
// snapshot's data. The catalog's blocking query in flight returns at once
// with the old data at its old index (no change by the index rules of
// consul/watch/loop.go); the health queries (Consul's streaming backend)
// are not woken at all; and a query asked again with an old index blocks
// on the restored state until a write lands past it or the wait (5 min)
// passes. So the restore reaches Kubernetes only because the catalog
// watch checks a return that is no change by a read from scratch, finds
// the index gone back (or the return early: TestToK8sSnapshotRestoreImport)
// and makes every health watch read from scratch
// (consul/watch/restore.go); then each watch sees its index go back, which
// the index rules treat as a full re-read.
func TestToK8sSnapshotRestore(t *testing.T) {
	e := newEnv(t)
	f := newSnapFleet(e, "s")
	own, name := f.own, f.name
	// Five services of two passing instances: 1 and 5 stay as they are,
	// 2 gains an instance, 3 has one turn critical, 4 is deregistered;
	// 6 is added.
	for i := 1; i <= 5; i++ {
		f.register(i, 1, "passing")
		f.register(i, 2, "passing")
	}
	d := e.mirrorOn(own, "", 0, nil, "--to-k8s-allow="+f.p+"-*") // no names: waited for below
	initial := func() {
		t.Helper()
		for i := 1; i <= 5; i++ {
			f.waitView(i, true, true)
		}
		f.waitGone(6)
	}
	initial()
	snap, err := own.SnapshotSave(e.ctx)
	must(t, err)

	f.register(2, 3, "passing")
	f.register(3, 2, "critical")
	f.deregister(4, 1)
	f.deregister(4, 2)
	f.register(6, 1, "passing")
	f.register(6, 2, "passing")
	f.waitView(2, true, true, true)
	f.waitView(3, true, false)
	f.waitGone(4)
	f.waitView(6, true, true)

	before := e.marked()
	log := e.k8sWriteLog()
	indexes := func() (catalog, health uint64) {
		t.Helper()
		_, cm, err := own.Client.Catalog().Services(nil)
		must(t, err)
		_, hm, err := own.Client.Health().Service(name(3), "", false, nil)
		must(t, err)
		return cm.LastIndex, hm.LastIndex
	}
	catalogBefore, healthBefore := indexes()
	start := time.Now()
	must(t, own.SnapshotRestore(e.ctx, snap))
	catalogAfter, healthAfter := indexes()
	t.Logf("X-Consul-Index across the restore: /v1/catalog/services %d -> %d, /v1/health/service/%s %d -> %d",
		catalogBefore, catalogAfter, name(3), healthBefore, healthAfter)
	initial()
	t.Logf("FIGURES %s: the snapshot's state mirrored %s after the restore began", t.Name(), time.Since(start).Round(time.Millisecond))

	if !strings.Contains(d.LogTail(200), "Consul's state went back") {
		t.Errorf("no restore found in the log")
	}

	time.Sleep(3 * time.Second) // a quiet interval: no further write may come; nothing to await
	want := []string{
		"slice/" + f.slice(2) + " update",
		"slice/" + f.slice(3) + " update",
		"slice/" + f.slice(4) + " create",
		"slice/" + f.slice(6) + " delete",
		"svc/" + name(4) + " create",
		"svc/" + name(6) + " delete",
	}
	slices.Sort(want)
	if got := log.sorted(); !slices.Equal(got, want) {
		t.Errorf("Kubernetes writes after the restore:\n%s\nwant exactly:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	changed := []string{"slice/" + f.slice(2), "slice/" + f.slice(3), "slice/" + f.slice(4) + " (new)",
		"slice/" + f.slice(6), "svc/" + name(4) + " (new)", "svc/" + name(6)}
	slices.Sort(changed)
	if got := e.changedSince(before); !slices.Equal(got, changed) {
		t.Errorf("objects changed by the restore: %v, want %v", got, changed)
	}
}

// TestToK8sSnapshotRestoreImport: import mode, and a restore that turns a
// check back to passing and leaves every service name as it was: the
// catalog's index stays where it was, and only the catalog query's early
// return tells of the restore. The slice is back within seconds (not at
// the end of the health query's 5 min wait), in one write.
func TestToK8sSnapshotRestoreImport(t *testing.T) {
	e := newEnv(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	p := e.cluster + "m"
	consulName, svc := p+"-pg", p+"-db"
	vmOn(t, own.Client, p+"-vm1", "10.89.9.1", consulName, 5432, "passing")
	ann := map[string]string{"fleetsync.io/consul-service": consulName}
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, svc, ann, map[string]int32{"pg": 5432})))
	e.daemonOn(own, "--to-k8s-import")
	passing := svc + "-4-5432-0[IPv4:5432]: 10.89.9.1=true/true/false"
	e.waitSlices(svc, passing)
	snap, err := own.SnapshotSave(e.ctx)
	must(t, err)
	vmOn(t, own.Client, p+"-vm1", "10.89.9.1", consulName, 5432, "critical")
	e.waitSlices(svc, svc+"-4-5432-0[IPv4:5432]: 10.89.9.1=false/false/false")

	log := e.k8sWriteLog()
	must(t, own.SnapshotRestore(e.ctx, snap))
	e.waitSlices(svc, passing)
	time.Sleep(3 * time.Second) // a quiet interval: no further write may come; nothing to await
	if got, want := log.sorted(), []string{"slice/" + svc + "-4-5432-0 update"}; !slices.Equal(got, want) {
		t.Errorf("Kubernetes writes after the restore: %v, want exactly %v", got, want)
	}
}

// TestToK8sSnapshotRestoreGuard: a restore that drops three of five
// mirrored services (more than half) is held by the mass-deletion guard:
// nothing is deleted within --to-k8s-deletion-grace; after it the catalog
// is read again and the three Services and their slices are deleted,
// nothing else written.
func TestToK8sSnapshotRestoreGuard(t *testing.T) {
	e := newEnv(t)
	f := newSnapFleet(e, "g")
	for i := 1; i <= 2; i++ {
		f.register(i, 1, "passing")
	}
	const grace = 5 * time.Second
	d := e.mirrorOn(f.own, "", 0, nil, "--to-k8s-allow="+f.p+"-*", "--to-k8s-deletion-grace="+grace.String())
	f.waitView(1, true)
	f.waitView(2, true)
	snap, err := f.own.SnapshotSave(e.ctx)
	must(t, err)
	for i := 3; i <= 5; i++ {
		f.register(i, 1, "passing")
		f.waitView(i, true)
	}

	log := e.k8sWriteLog()
	must(t, f.own.SnapshotRestore(e.ctx, snap))
	restored := time.Now()
	eventually(t, 20*time.Second, "the guard holding the mass drop", func() error {
		if !strings.Contains(d.LogTail(500), "drops most mirrored Services; holding") {
			return fmt.Errorf("no hold in the log")
		}
		return nil
	})
	if got := log.sorted(); len(got) != 0 && time.Since(restored) < grace {
		t.Fatalf("within the grace period: written %v", got)
	}
	for i := 3; i <= 5; i++ {
		f.waitGone(i)
	}
	if held := time.Since(restored); held < grace {
		t.Errorf("deleted %s after the restore, before the grace period of %s passed", held.Round(time.Millisecond), grace)
	}
	time.Sleep(2 * time.Second) // a quiet interval: no further write may come; nothing to await
	var want []string
	for i := 3; i <= 5; i++ {
		want = append(want, "slice/"+f.slice(i)+" delete", "svc/"+f.name(i)+" delete")
	}
	slices.Sort(want)
	if got := log.sorted(); !slices.Equal(got, want) {
		t.Errorf("Kubernetes writes after the restore: %v, want exactly %v", got, want)
	}
}
