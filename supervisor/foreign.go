package supervisor

import (
	"sort"
	"strings"

	"github.com/fleetsync/fleetsync/consul"
)

// foreignNodes reports look-alike nodes: logged once each, counted, and
// kept as a readiness problem while they exist; once one is gone, the
// workers it held back retry at once.
func (s *Supervisor) foreignNodes(nodes []consul.NodeEntry, reported map[string]bool) {
	s.opts.Hooks.Consul.ForeignNodes(len(nodes))
	now := map[string]bool{}
	s.problemsMu.Lock()
	for k := range s.problems {
		if strings.HasPrefix(k, "node/") {
			delete(s.problems, k)
		}
	}
	for _, n := range nodes {
		now[n.Name] = true
		err := &consul.ForeignNodeError{Node: n.Name, Address: n.Address, Meta: n.Meta}
		if s.nodeInUse(n.Name) {
			s.problems["node/"+n.Name] = err.Error()
		}
		if !reported[n.Name] {
			s.log.Error("A node named like ours is someone else's; nothing is written onto it", "node", n.Name, "address", n.Address, "meta", n.Meta)
		}
	}
	s.problemsMu.Unlock()
	gone := false
	for name := range reported {
		if !now[name] {
			delete(reported, name)
			gone = true
			s.log.Info("The look-alike node is gone; its Services sync again", "node", name)
		}
	}
	for name := range now {
		reported[name] = true
	}
	if gone {
		// The workers refused by it back off (up to MaxBackoff): they
		// retry now, with the node read that found it gone.
		s.retryAll()
	}
}

// nodeInUse reports whether instances are placed on node with the current
// number of Consul nodes (a look-alike beyond them blocks nothing).
func (s *Supervisor) nodeInUse(node string) bool {
	n, ok := s.opts.Worker.Cluster.NodeNumber(node)
	return ok && n < s.consulNodes()
}

// Problems returns what keeps the fleet from syncing every Service (a
// look-alike node, say) or its instances out of Consul's healthy answers
// (a failing check someone else put on them), sorted; /readyz fails while
// there is any.
func (s *Supervisor) Problems() []string {
	s.problemsMu.Lock()
	defer s.problemsMu.Unlock()
	out := make([]string, 0, len(s.problems))
	for _, p := range s.problems {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
