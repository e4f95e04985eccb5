package conn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The first address is tried again failbackMin after it failed; each time
// it fails again within failbackCalm of requests going back to it, the
// wait doubles, up to failbackMax (a server that answers the probe but not
// the requests costs a request's deadline at most that often).
const (
	failbackMin  = 5 * time.Second
	failbackMax  = 5 * time.Minute
	failbackCalm = time.Minute
)

// Identify reads the Identity of every address (at once, each within
// identityTimeout) and makes the first address that answered the
// reference: every other address that answered must be of its
// datacenter and cluster, else the error (ErrNotOneCluster) names each
// address with what it said. dc, when not empty, is the datacenter
// requests are sent to (one the reference knows, else the error matches
// ErrUnknownDatacenter); else the reference's. Addresses that did not
// answer are not used until Run has checked them. An error without
// ErrNotOneCluster means no address answered: try again.
func (s *Servers) Identify(ctx context.Context, dc string) (Identity, error) {
	addrs := s.Addresses()
	ids, errs := s.probe.identities(ctx, addrs)
	ref := -1
	for i := range addrs {
		if errs[i] == nil {
			ref = i
			break
		}
	}
	if ref < 0 {
		return Identity{}, errors.Join(errs...)
	}
	var says []string
	mixed := false
	for i, a := range addrs {
		if errs[i] != nil {
			continue
		}
		say := fmt.Sprintf("%s is %s", a, ids[i])
		if same, why := ids[i].sameAs(ids[ref]); !same {
			mixed = true
			say += " (" + why + ")"
		}
		says = append(says, say)
	}
	if mixed {
		return ids[ref], fmt.Errorf("--consul-address: %w: %s; list the servers (or agents) of one datacenter only (--consul-datacenter names the datacenter requests are for, not which addresses to use)",
			ErrNotOneCluster, strings.Join(says, "; "))
	}
	want := ids[ref]
	if dc != "" && !slices.Contains(want.Datacenters, dc) {
		return want, fmt.Errorf("--consul-datacenter (or CONSUL_DATACENTER) %q: %w: %s knows %s; every request would fail with \"No path to datacenter\"",
			dc, ErrUnknownDatacenter, addrs[ref], strings.Join(want.Datacenters, ","))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want = &want
	s.dc = dc
	if s.dc == "" {
		s.dc = want.Datacenter
	}
	s.pending = map[string]bool{}
	for i, a := range addrs {
		if errs[i] != nil {
			s.pending[a] = true
			s.log.Warn("Consul address did not answer at start; not used until it answers as one of the same datacenter and cluster", "address", a, "error", errs[i])
		}
	}
	if !s.usableLocked(s.addrs[s.current]) {
		s.current = s.nextLocked()
	}
	return want, nil
}

// Run checks, every failbackMin and when a failover finds no other
// address, the addresses Identify could not read, and goes back to the
// first address once it answers again (a fixed list only: the addresses
// of a DNS name come in no order). It returns nil when ctx is done.
func (s *Servers) Run(ctx context.Context) error {
	for {
		s.checkPending(ctx)
		s.failBack(ctx)
		t := s.clock.NewTimer(failbackMin)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.kick:
			t.Stop()
			// At most one check a second, however many requests fail.
			w := s.clock.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				w.Stop()
				return nil
			case <-w.C():
			}
		case <-t.C():
		}
	}
}

// checkPending reads the Identity of each address not checked yet and
// compares it with the current address's (read again: a Consul rebuilt
// empty has a new trust domain), else with the one Identify read. An
// address of the same datacenter and cluster is used from now on; one of
// another is refused for good.
func (s *Servers) checkPending(ctx context.Context) {
	s.mu.Lock()
	var todo []string
	for a, p := range s.pending {
		if p {
			todo = append(todo, a)
		}
	}
	cur, want := s.addrs[s.current], s.want
	s.mu.Unlock()
	if len(todo) == 0 || want == nil {
		return
	}
	ref := *want
	if id, err := s.probe.identity(ctx, cur); err == nil {
		ref = id
	}
	ids, errs := s.probe.identities(ctx, todo)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, a := range todo {
		if errs[i] != nil {
			continue // still pending
		}
		delete(s.pending, a)
		if same, why := ids[i].sameAs(ref); !same {
			if s.refused == nil {
				s.refused = map[string]string{}
			}
			s.refused[a] = why
			s.log.Error("Consul address belongs to another datacenter or cluster; never used", "address", a, "it_is", ids[i].String(), "want", ref.String(), "why", why)
			continue
		}
		s.log.Info("Consul address checked: same datacenter and cluster; used from now on", "address", a)
	}
}

// Refused maps each address found to be of another datacenter or cluster
// after the start to why.
func (s *Servers) Refused() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.refused))
	for a, why := range s.refused {
		out[a] = why
	}
	return out
}

// failBack makes the first address current again when requests went
// elsewhere, its wait since it failed is over, and it answers with a
// leader.
func (s *Servers) failBack(ctx context.Context) {
	s.mu.Lock()
	first := s.addrs[0]
	due := s.resolved == "" && s.current != 0 && s.usableLocked(first) &&
		s.clock.Since(s.firstFailed) >= s.backWait
	s.mu.Unlock()
	if !due {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	if _, err := s.probe.leader(pctx, first, nil); err != nil {
		s.log.Debug("The first Consul address does not answer yet", "address", first, "error", err)
		return
	}
	s.mu.Lock()
	from := s.addrs[s.current]
	s.current, s.backAt = 0, s.clock.Now()
	s.mu.Unlock()
	s.log.Info("The first Consul address answers again; requests go back to it", "address", first, "from", from)
}

// firstFailedLocked records a failure of the first address: the wait
// before going back to it doubles when it failed soon after the last
// return.
func (s *Servers) firstFailedLocked() {
	now := s.clock.Now()
	if !s.backAt.IsZero() && now.Sub(s.backAt) < failbackCalm {
		s.backWait = min(2*s.backWait, failbackMax)
	} else {
		s.backWait = failbackMin
	}
	s.firstFailed = now
}
