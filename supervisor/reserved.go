package supervisor

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ReservedTags holds the ids of the other clusters that share the Consul:
// a user tag equal to one of them would make <that id>.<name>.service.consul
// return this cluster's instances, so workers leave such tags out
// (worker.Config.ReservedTag). Safe for concurrent use.
type ReservedTags struct {
	ids atomic.Pointer[[]string] // sorted
}

// Lookup is a worker.Config.ReservedTag.
func (r *ReservedTags) Lookup(tag string) (string, bool) {
	p := r.ids.Load()
	if p == nil {
		return "", false
	}
	if _, ok := slices.BinarySearch(*p, tag); ok {
		return tag, true
	}
	return "", false
}

// set stores ids and reports whether they changed.
func (r *ReservedTags) set(ids []string) bool {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	if p := r.ids.Load(); p != nil && slices.Equal(*p, ids) {
		return false
	}
	r.ids.Store(&ids)
	return true
}

// Run reads the ids every interval until ctx is done; when they change,
// changed is called (every worker looks again).
func (r *ReservedTags) Run(ctx context.Context, interval time.Duration, read func(context.Context) ([]string, error), changed func(), log hclog.Logger) {
	for {
		if ids, err := read(ctx); err == nil {
			if r.set(ids) {
				log.Debug("Other clusters sharing this Consul", "cluster_ids", ids)
				changed()
			}
		} else if ctx.Err() == nil {
			log.Debug("Cannot list the other clusters' ids", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// NotifyAll tells every worker to look again at its Service.
func (s *Supervisor) NotifyAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.workers {
		e.w.Notify()
	}
}
