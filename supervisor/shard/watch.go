package shard

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/fleetsync/fleetsync/k8s"
)

// watch starts an informer on this cluster's Leases and waits for its
// first list. Every change is sighted; a change of holder (a shard
// released or taken, a replica come or gone) wakes the loop at once. A
// list or watch the API server refuses (RBAC) is an error, returned here
// while waiting for the first list and later on m.fatal (once the 403s
// have lasted a lease duration: forbids). stop ends the
// watch and waits for its goroutines.
func (m *Manager) watch(ctx context.Context) (stop func(), err error) {
	// The list and watch are k8s.Patient, as the Watcher's are: after an API
	// server outage the Leases are seen again within a second, not after
	// client-go's reflector backoff (up to 30 s), so shards are taken over
	// and handed back on time.
	sel, leases := m.names.selector(), m.api.CoordinationV1().Leases(m.cfg.Namespace)
	lw := k8s.Patient(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			// Only a watch proves the path works: a list alone
			// (RBAC without watch) would keep resetting the 403s.
			w, err := leases.Watch(ctx, o)
			if err == nil {
				m.watchForbids.answered()
			}
			return w, err
		},
	}, "Lease", m.clock, m.log)
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, m.api), &coordinationv1.Lease{},
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}, ObjectDescription: "Lease"})
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    m.sight,
		UpdateFunc: func(_, obj any) { m.sight(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if l, ok := obj.(*coordinationv1.Lease); ok {
				m.seenMu.Lock()
				delete(m.seen, l.Name)
				m.seenMu.Unlock()
				m.poke()
			}
		},
	})
	if err != nil {
		return func() {}, fmt.Errorf("watch the Leases: %w", err)
	}
	err = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if apierrors.IsForbidden(err) && m.watchForbids.fatal(m.clock.Now(), m.cfg.LeaseDuration) {
			select {
			case m.fatal <- fmt.Errorf("watch the Leases in namespace %s: %w", m.cfg.Namespace, err):
			default:
			}
		}
	})
	if err != nil {
		return func() {}, fmt.Errorf("watch the Leases: %w", err)
	}
	m.leases = coordinationlisters.NewLeaseLister(inf.GetIndexer()).Leases(m.cfg.Namespace)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { inf.RunWithContext(wctx) })
	stop = func() { cancel(); wg.Wait() }
	// The handler's own sync: every Lease of the first list sighted (the
	// informer's store can be synced before its handlers have seen it).
	synced := make(chan bool, 1)
	go func() { synced <- cache.WaitForCacheSync(wctx.Done(), reg.HasSynced) }()
	select {
	case err := <-m.fatal:
		cancel()
		<-synced
		return stop, err
	case <-synced:
		return stop, nil // false only when ctx is done
	}
}

func (m *Manager) sight(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	m.seenMu.Lock()
	old, had := m.seen[l.Name]
	if !had || old.rv != l.ResourceVersion || !apiequality.Semantic.DeepEqual(old.spec, l.Spec) {
		m.seen[l.Name] = newSighting(l, m.clock.Now(), !had)
		if l.Name == m.names.replica() && holder == m.cfg.ReplicaID {
			m.checkOwnRenewal(l.Spec.RenewTime)
		}
	}
	m.seenMu.Unlock()
	if !had || old.holder != holder {
		m.poke()
	}
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// sightOwnWrite records a Lease this replica has just written, unless the
// watch has already sighted a change since before (the sighting that was
// current before the write).
func (m *Manager) sightOwnWrite(before sighting, l *coordinationv1.Lease) {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	if cur := m.seen[l.Name]; cur.rv == before.rv && apiequality.Semantic.DeepEqual(cur.spec, before.spec) {
		m.seen[l.Name] = newSighting(l, m.clock.Now(), false)
	}
}

// checkOwnRenewal notes a change of this replica's Lease that names it:
// one of its own renewals, or, once it has renewed at least once, another
// process's with the same --replica-id. That one would hold the same shards
// (each takes a shard Lease naming its identity for its own), so it is
// counted and, from the second one on, logged as an error at most once a
// lease duration. (The first is not logged: an update whose answer was
// lost looks the same once.) Called with seenMu held.
func (m *Manager) checkOwnRenewal(renewed *metav1.MicroTime) {
	if renewed == nil || len(m.ownRenews) == 0 {
		return // before the first renewal: the Lease an earlier process left
	}
	for _, t := range m.ownRenews {
		if t.Truncate(time.Microsecond).Equal(renewed.Time.Truncate(time.Microsecond)) {
			return
		}
	}
	m.foreign++
	m.fleet.ReplicaIDConflict()
	if now := m.clock.Now(); m.foreign >= 2 && now.Sub(m.foreignLogs) >= m.cfg.LeaseDuration {
		m.foreignLogs = now
		m.log.Error("Another process renews this replica's Lease: --replica-id must be unique (the default, the pod name, is); both processes hold the same shards",
			"replica", m.cfg.ReplicaID, "lease", m.names.replica(), "foreign_renewals", m.foreign)
	}
}
