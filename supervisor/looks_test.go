package supervisor

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/fleetsync/fleetsync/k8s"
)

// lookWatcher records, at every lookup after bootstrap, how many of the
// fleet's look slots are held.
type lookWatcher struct {
	*fakeWatcher
	sup atomic.Pointer[Supervisor]
	sum atomic.Int64
}

func (l *lookWatcher) Service(key k8s.Key) (*k8s.Service, bool, error) {
	if s := l.sup.Load(); s != nil && s.Bootstrapped() {
		l.sum.Add(int64(s.looks.InUse()))
	}
	return l.fakeWatcher.Service(key)
}

// TestWorkersLookInTheFleetsSlots: the fleet's workers share one set of
// look slots, as many as the cores (worker.Options.Looks): the workers'
// first looks, all at once when the gate opens, hold them.
func TestWorkersLookInTheFleetsSlots(t *testing.T) {
	fw, store := newFakeWatcher(), newMemStore()
	for i := range 40 {
		name := fmt.Sprintf("s%02d", i)
		fw.services[k8s.Key{Namespace: "ns", Name: name}] = service("ns", name, fmt.Sprintf("10.0.0.%d", i+1))
	}
	lw := &lookWatcher{fakeWatcher: fw}
	f := startOptions(t, fw, store, func(o *Options) { o.Watcher = lw }, func(s *Supervisor) { lw.sup.Store(s) })
	close(fw.synced)
	f.waitFor(t, "every Service registered", func() bool {
		for i := range 40 {
			if store.count(f.cluster.IDPrefix("ns", fmt.Sprintf("s%02d", i))) != 1 {
				return false
			}
		}
		return true
	})
	if got, cores := f.sup.looks.Size(), runtime.GOMAXPROCS(0); got != cores {
		t.Errorf("%d look slots for %d cores", got, cores)
	}
	if lw.sum.Load() == 0 {
		t.Error("no lookup was made in a look slot")
	}
}
