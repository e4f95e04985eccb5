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
	before := s.waitingLocked()
	s.latest, s.names, s.filtered = sel, c.Names, c.FilteredByACLs
	s.mu.Unlock()
	s.judge(reread, before)
}

// judge selects the latest answer, unless it is a mass drop: then the
// dropped units stay (mirror units selected, import units held) until a
// read made once the grace period passed (new names are selected at
// once), or until an answer drops none of them. An answer Consul filtered
// for the token (a token that lost service:read) that is a mass drop is
// held for as long as Consul sends it, with no re-read. The units judged
// are the mirrored Services and the import units of the daemon's own
// scope that have slices (imports.go, judged); before is waitingLocked
// before the answer, so that the workers whose view changed look again.
// Before the gate opens it does nothing: the gate judges the answer in
// hand.
func (s *Supervisor) judge(reread bool, before map[owned.Key]bool) {
	s.mu.Lock()
	if s.ctx == nil {
		s.mu.Unlock()
		return
	}
	sel, filtered := s.latest, s.filtered
	kept := map[owned.Key]source{}
	mirrored := 0
	if s.opts.Mirror { // import mode alone selects nothing: mirror mode switched off deletes
		kept, mirrored = s.dropped(sel), len(s.mirrored())
	}
	gone, imported := s.importsDropped()
	dropped, units := len(kept)+len(gone), mirrored+imported
	now := s.opts.Clock.Now()
	grace := s.opts.DeletionGrace
	mass := Mass(dropped, units)
	switch {
	case dropped == 0 || !mass && s.holding.IsZero():
		if !s.holding.IsZero() || s.heldFiltered {
			s.log.Info("Catalog answer drops no held Service; deletion guard released", "mirrored", units)
		}
		s.release(sel)
	case filtered && mass:
		if !s.heldFiltered {
			s.heldFiltered = true
			s.log.Warn("Catalog answer filtered by ACLs drops most mirrored Services; nothing is deleted while the token cannot read them",
				"dropped", dropped, "mirrored", units, "imports", len(gone))
		}
		s.hold(sel, kept, gone)
	case s.holding.IsZero():
		s.holding = now
		s.log.Warn("Catalog answer drops most mirrored Services; holding them, reading again after the grace period",
			"dropped", dropped, "mirrored", units, "imports", len(gone), "grace", grace)
		s.hold(sel, kept, gone)
		s.arm(grace)
	case reread && now.Sub(s.holding) >= grace:
		s.log.Warn("Catalog read after the grace period still drops mirrored Services; deleting them", "dropped", dropped, "mirrored", units)
		s.release(sel)
	default:
		s.hold(sel, kept, gone)
		if reread {
			s.arm(grace - now.Sub(s.holding))
		}
	}
	var look []owned.Key
	for k, w := range s.waitingLocked() {
		if before[k] != w {
			look = append(look, k)
		}
	}
	s.mu.Unlock()
	for _, k := range look {
		s.changed(k)
	}
	s.reconcile()
}

// release selects sel and holds nothing; s.mu is held.
func (s *Supervisor) release(sel map[owned.Key]source) {
	s.selected, s.held, s.holding, s.heldFiltered = sel, map[owned.Key]bool{}, time.Time{}, false
}

// hold selects sel and the dropped mirror units kept, and holds them and
// the dropped import units gone; s.mu is held.
func (s *Supervisor) hold(sel, kept map[owned.Key]source, gone map[owned.Key]bool) {
	next := make(map[owned.Key]source, len(sel)+len(kept))
	held := make(map[owned.Key]bool, len(kept)+len(gone))
	for k, v := range sel {
		next[k] = v
	}
	for k, v := range kept {
		next[k], held[k] = v, true
	}
	for k := range gone {
		held[k] = true
	}
	s.selected, s.held = next, held
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
