package tok8s

import (
	"context"
	"time"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

// DefaultDeletionGrace is how long a mass drop is held before the catalog
// is read again (--to-k8s-deletion-grace).
const DefaultDeletionGrace = 30 * time.Second

// Mass reports whether an answer that drops dropped of the mirrored
// Services is a mass drop: more than half of them, and at least two (one
// name gone is an ordinary deregistration).
func Mass(dropped, mirrored int) bool { return dropped >= 2 && 2*dropped > mirrored }

// onCatalog takes one catalog answer; reread is true for the guard's own
// read after the grace period.
func (s *Supervisor) onCatalog(c watch.Catalog, reread bool) {
	sel := s.selection(c.Names)
	s.mu.Lock()
	s.latest, s.filtered = sel, c.FilteredByACLs
	s.mu.Unlock()
	s.judge(reread)
}

// judge selects the latest answer, unless it is a mass drop: then the
// dropped Services stay selected until a read made once the grace period
// passed (new names are selected at once), or until an answer drops none
// of them. An answer Consul filtered for the token (a token that lost
// service:read) that is a mass drop is held for as long as Consul sends
// it, with no re-read. Before the gate opens it does nothing: the gate
// judges the answer in hand.
func (s *Supervisor) judge(reread bool) {
	s.mu.Lock()
	if s.ctx == nil {
		s.mu.Unlock()
		return
	}
	if !s.opts.Mirror { // import mode alone selects nothing: mirror mode switched off deletes
		s.mu.Unlock()
		s.reconcile()
		return
	}
	sel, filtered := s.latest, s.filtered
	kept := s.dropped(sel)
	now := s.opts.Clock.Now()
	grace := s.opts.DeletionGrace
	mirrored := len(s.mirrored())
	mass := Mass(len(kept), mirrored)
	switch {
	case len(kept) == 0 || !mass && s.holding.IsZero():
		if !s.holding.IsZero() || s.heldFiltered {
			s.log.Info("Catalog answer drops no held Service; deletion guard released", "mirrored", mirrored)
		}
		s.selected, s.holding, s.heldFiltered = sel, time.Time{}, false
	case filtered && mass:
		if !s.heldFiltered {
			s.heldFiltered = true
			s.log.Warn("Catalog answer filtered by ACLs drops most mirrored Services; nothing is deleted while the token cannot read them",
				"dropped", len(kept), "mirrored", mirrored)
		}
		s.hold(sel, kept)
	case s.holding.IsZero():
		s.holding = now
		s.log.Warn("Catalog answer drops most mirrored Services; holding them, reading again after the grace period",
			"dropped", len(kept), "mirrored", mirrored, "grace", grace)
		s.hold(sel, kept)
		s.arm(grace)
	case reread && now.Sub(s.holding) >= grace:
		s.log.Warn("Catalog read after the grace period still drops mirrored Services; deleting them", "dropped", len(kept), "mirrored", mirrored)
		s.selected, s.holding, s.heldFiltered = sel, time.Time{}, false
	default:
		s.hold(sel, kept)
		if reread {
			s.arm(grace - now.Sub(s.holding))
		}
	}
	s.mu.Unlock()
	s.reconcile()
}

// hold selects sel and the dropped units kept; s.mu is held.
func (s *Supervisor) hold(sel, kept map[owned.Key]source) {
	next := make(map[owned.Key]source, len(sel)+len(kept))
	for k, v := range sel {
		next[k] = v
	}
	for k, v := range kept {
		next[k] = v
	}
	s.selected = next
}

// mirrored is every Service of mirror mode that is fleetsync's now, with
// its Consul name (from the selection, else the Service's annotation).
func (s *Supervisor) mirrored() map[owned.Key]source {
	out := map[owned.Key]source{}
	for _, k := range s.opts.Owned.Keys() {
		if k.Namespace != s.opts.Namespace {
			continue
		}
		svc, ok := s.opts.Owned.Service(k.Namespace, k.Name)
		if !ok {
			continue
		}
		src, ok := s.selected[k]
		if !ok {
			src = source{consul: svc.Annotations[k8smark.AnnotationConsulService], query: s.opts.Query, window: -1}
		}
		if src.consul != "" {
			out[k] = src
		}
	}
	return out
}

// dropped is the mirrored Services that sel does not select; s.mu is held.
func (s *Supervisor) dropped(sel map[owned.Key]source) map[owned.Key]source {
	out := map[owned.Key]source{}
	for k, src := range s.mirrored() {
		if _, ok := sel[k]; !ok {
			out[k] = src
		}
	}
	return out
}

// arm asks the guard's goroutine to read the catalog again after d; s.mu
// is held.
func (s *Supervisor) arm(d time.Duration) {
	select {
	case s.recheck <- max(d, 0):
	default: // one read is already due
	}
}

// guardLoop reads the catalog again whenever the guard asks, until ctx is
// done.
func (s *Supervisor) guardLoop(ctx context.Context) {
	for {
		var d time.Duration
		select {
		case <-ctx.Done():
			return
		case d = <-s.recheck:
		}
		t := s.opts.Clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		c, _, err := s.opts.Catalog(ctx, 0)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("Catalog read of the deletion guard failed; holding", "error", err)
			s.mu.Lock()
			s.arm(s.opts.DeletionGrace)
			s.mu.Unlock()
			continue
		}
		s.onCatalog(c, true)
	}
}
