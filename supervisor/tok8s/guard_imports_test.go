package tok8s

import (
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fleetsync/fleetsync/ownership/k8smark"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

// importNames are the import units of newGuardedImports: Service i<n>
// reads Consul service c<n>; i5 reads another datacenter, i6 has a tag
// annotation, i7 has no slices yet.
var importNames = []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7"}

// newGuardedImports is a supervisor in import mode alone (no mirror) past
// its gate, over seven import-mode Services, six with slices; its workers
// are parked (the gate stays closed for them), its guard runs on a fake
// clock, and the catalog's re-read answers cur.
func newGuardedImports(t *testing.T) *guarded {
	t.Helper()
	mark, err := k8smark.New("c1")
	if err != nil {
		t.Fatal(err)
	}
	imports := fakeImports{}
	var objs []runtime.Object
	for i, c := range importNames {
		name := "i" + c[1:]
		ann := map[string]string{k8smark.AnnotationConsulService: c}
		switch i {
		case 4:
			ann[AnnotationDatacenter] = "dc2"
		case 5:
			ann[AnnotationTag] = "blue"
		}
		svc := annotated(ann)
		svc.Key.Name, svc.Object.Name = name, name
		imports[svc.Key] = svc
		if i == 6 {
			continue
		}
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-4-80-0",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
		mark.Stamp(sl)
		objs = append(objs, sl)
	}
	return guardOver(t, objs, Options{Namespace: "m", Imports: imports, Config: wtok8s.Config{Mark: mark}})
}

// waiting is the import units whose empty health answer waits for the
// catalog (wtok8s.Unit.CatalogDecides), and those the guard holds.
func (g *guarded) waiting() (waits, held []string) {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	for k := range g.s.imports {
		u, _, _ := g.s.unitLocked(k)
		if u.CatalogDecides {
			waits = append(waits, k.Name)
		}
		if g.s.held[k] {
			held = append(held, k.Name)
		}
	}
	slices.Sort(waits)
	slices.Sort(held)
	return waits, held
}

func (g *guarded) wantWaiting(t *testing.T, waits, held []string) {
	t.Helper()
	w, h := g.waiting()
	if !slices.Equal(w, waits) || !slices.Equal(h, held) {
		t.Fatalf("waiting %v held %v; want %v and %v", w, h, waits, held)
	}
}

// TestGuardHoldsImports: an answer that drops most import units of the
// daemon's scope that have slices (i1-i4 and i6; i5 reads another
// datacenter, i7 has none) holds the dropped ones until the re-read after
// the grace period, which releases them.
func TestGuardHoldsImports(t *testing.T) {
	g := newGuardedImports(t)
	g.answer(catalog(importNames...))
	// Listed: an empty health answer waits for the catalog; not i5
	// (another datacenter) nor i6 (a tag: empty can be an answer).
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i7"}, nil)
	g.answer(catalog("c1", "c5", "c7"))
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i6", "i7"}, []string{"i2", "i3", "i4", "i6"})
	g.waitTimer(t)
	g.clk.Step(testGrace - time.Second)
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i6", "i7"}, []string{"i2", "i3", "i4", "i6"})
	g.clk.Step(time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for _, held := g.waiting(); len(held) > 0; _, held = g.waiting() {
		if time.Now().After(deadline) {
			t.Fatalf("still held after the re-read: %v", held)
		}
		time.Sleep(time.Millisecond) // polling for the guard goroutine's re-read
	}
	g.wantWaiting(t, []string{"i1", "i7"}, nil)
}

// TestGuardImportsBackWithinGrace: the names back within the grace period
// release the hold at once.
func TestGuardImportsBackWithinGrace(t *testing.T) {
	g := newGuardedImports(t)
	g.answer(catalog(importNames...))
	g.answer(catalog())
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i6"}, []string{"i1", "i2", "i3", "i4", "i6"})
	g.answer(catalog(importNames...))
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i7"}, nil)
}

// TestGuardLetsOneImportGo: one name gone is an ordinary deregistration:
// its unit's empty health answer is applied at once.
func TestGuardLetsOneImportGo(t *testing.T) {
	g := newGuardedImports(t)
	g.answer(catalog(importNames...))
	g.answer(catalog("c1", "c3", "c4", "c5", "c6", "c7"))
	g.wantWaiting(t, []string{"i1", "i3", "i4", "i7"}, nil)
	if g.clk.HasWaiters() {
		t.Fatal("a re-read is armed for one name gone")
	}
}

// TestGuardImportsFilteredByACLs: a mass drop Consul filtered for the
// token holds the import units with no re-read, and the status of their
// workers says so.
func TestGuardImportsFilteredByACLs(t *testing.T) {
	g := newGuardedImports(t)
	g.answer(catalog(importNames...))
	filtered := catalog("c5")
	filtered.FilteredByACLs = true
	g.answer(filtered)
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i6"}, []string{"i1", "i2", "i3", "i4", "i6"})
	if g.clk.HasWaiters() {
		t.Fatal("a re-read is armed for an answer filtered by ACLs")
	}
	g.clk.Step(10 * testGrace)
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i6"}, []string{"i1", "i2", "i3", "i4", "i6"})
	sts := g.s.Workers()
	if len(sts) != len(importNames) {
		t.Fatalf("%d workers, want %d", len(sts), len(importNames))
	}
	for _, st := range sts {
		held := slices.Contains([]string{"i1", "i2", "i3", "i4", "i6"}, st.Service)
		if (st.Held == wtok8s.HeldCatalogDrop) != held {
			t.Errorf("worker %s: Held %q", st.Service, st.Held)
		}
	}
}

// TestGuardImportsAtBootstrap: the first answer after a restart over a
// Consul restarted empty holds the import units that have slices.
func TestGuardImportsAtBootstrap(t *testing.T) {
	g := newGuardedImports(t)
	g.answer(catalog())
	g.wantWaiting(t, []string{"i1", "i2", "i3", "i4", "i6"}, []string{"i1", "i2", "i3", "i4", "i6"})
}
