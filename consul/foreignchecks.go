package consul

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// ForeignCheck is a health check on one of the owner's nodes that the owner
// did not write: a node-level check (ServiceID "": `_node_maintenance`,
// say), which Consul applies to every instance on the node, or a check
// under the service ID of an owned instance other than its readiness
// check. A non-passing one takes the instances out of Consul's healthy
// answers and DNS. It is someone else's: the client never writes or
// deletes it, it only reports what its reads saw (Client.ForeignChecks).
type ForeignCheck struct {
	Node    string
	CheckID string
	Status  string
	Output  string
	// ServiceID is the instance the check is under; "" for a node check.
	ServiceID string
	// ServiceName is that instance's Consul service name (service checks).
	ServiceName string
	// Meta is the meta of that instance, an owned one (service checks).
	Meta map[string]string
}

// NodeLevel reports whether the check is on the node, not on an instance.
func (f ForeignCheck) NodeLevel() bool { return f.ServiceID == "" }

// foreignChecks is what the reads of owned state saw of foreign checks.
// The reads already fetch every check of what they read (the bootstrap and
// repair reads every check of every node of the owner, each anti-entropy
// read the node checks and service checks of one name), so keeping what
// they see costs Consul nothing. Each read replaces what it covers: a
// check it no longer sees is gone.
//
// Reads run concurrently and may end in any order: what a read knows of
// a check is taken only when no read that began after it already said
// something about that check (present, or gone: a gone check is kept as
// such until every read older than that has ended), so an answer that
// took longer never brings back a check a newer read saw gone.
type foreignChecks struct {
	mu       sync.Mutex
	seq      uint64              // reads begun
	inflight map[uint64]struct{} // reads begun and not ended, by begin
	byKey    map[string]seenCheck
	// changed gets a value (1-buffered, never blocking) when what
	// ForeignChecks returns changes.
	changed chan struct{}
}

// seenCheck is what the latest read that covered a check said of it.
type seenCheck struct {
	ForeignCheck
	at   uint64 // the begin of that read
	gone bool
}

func newForeignChecks() foreignChecks {
	return foreignChecks{changed: make(chan struct{}, 1), inflight: map[uint64]struct{}{}}
}

func (f ForeignCheck) key() string { return f.Node + "/" + f.ServiceID + "/" + f.CheckID }

// begin is called before a read's requests; end (deferred) after its
// record, whether it recorded or not.
func (r *foreignChecks) begin() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.inflight[r.seq] = struct{}{}
	return r.seq
}

func (r *foreignChecks) end(began uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inflight, began)
	oldest := r.seq + 1
	for b := range r.inflight {
		oldest = min(oldest, b)
	}
	for k, e := range r.byKey {
		if e.gone && e.at < oldest {
			delete(r.byKey, k) // no read left that could bring it back
		}
	}
}

// replace records a read begun at began: every check covered(node,
// check) says the read covered and it did not see is gone, every one in
// seen is there.
func (r *foreignChecks) replace(began uint64, covered func(node string, f *ForeignCheck) bool, seen map[string][]ForeignCheck) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.byKey) == 0 && len(seen) == 0 {
		return // nearly always: nothing to do, no allocation
	}
	if r.byKey == nil {
		r.byKey = map[string]seenCheck{}
	}
	changed := false
	there := map[string]bool{}
	for _, fs := range seen {
		for _, f := range fs {
			k := f.key()
			there[k] = true
			e, ok := r.byKey[k]
			if ok && e.at > began {
				continue // a newer read said more
			}
			changed = changed || !ok || e.gone || !sameCheck(e.ForeignCheck, f)
			r.byKey[k] = seenCheck{ForeignCheck: f, at: began}
		}
	}
	for k, e := range r.byKey {
		if !there[k] && !e.gone && e.at < began && covered(e.Node, &e.ForeignCheck) {
			e.gone, e.at = true, began
			r.byKey[k] = e
			changed = true
		}
	}
	if !changed {
		return
	}
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func sameCheck(x, y ForeignCheck) bool {
	return x.Node == y.Node && x.CheckID == y.CheckID && x.Status == y.Status && x.Output == y.Output &&
		x.ServiceID == y.ServiceID && x.ServiceName == y.ServiceName
}

// ForeignChecks returns the foreign checks on the owner's nodes as the
// latest reads saw them, sorted by node, service ID and check ID. A check
// appears once a read that covers it ran (the bootstrap read, a repair, a
// worker's anti-entropy pass over a name on that node) and goes with the
// first such read that no longer sees it.
func (c *Client) ForeignChecks() []ForeignCheck {
	r := &c.checks
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ForeignCheck
	for _, e := range r.byKey {
		if !e.gone {
			out = append(out, e.ForeignCheck)
		}
	}
	slices.SortFunc(out, func(a, b ForeignCheck) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.ServiceID, b.ServiceID), cmp.Compare(a.CheckID, b.CheckID))
	})
	return out
}

// ForeignChecksChanged gets a value when what ForeignChecks returns
// changed (one value stands for any number of changes).
func (c *Client) ForeignChecksChanged() <-chan struct{} { return c.checks.changed }

// foreignOf returns hc as a foreign check on node when it is not the
// readiness check of its service; svc is that service (nil for a node
// check, or when the service is not known), whose ownership decides
// whether a service check is reported at all (someone else's entry under
// one of our IDs is reported as such by the worker, not its checks).
func (c *Client) foreignOf(node string, hc *wire.Check, svc *wire.Service) (ForeignCheck, bool) {
	if hc == nil || isCheckOf(hc.CheckID, hc.ServiceID) {
		return ForeignCheck{}, false
	}
	f := ForeignCheck{Node: node, CheckID: hc.CheckID, Status: hc.Status, Output: hc.Output, ServiceID: hc.ServiceID}
	if f.NodeLevel() {
		return f, true
	}
	if svc == nil || svc.ID != hc.ServiceID || c.owner.Owns(fromWire(node, svc, nil)) != nil {
		return ForeignCheck{}, false
	}
	f.ServiceName, f.Meta = svc.Service, svc.Meta
	return f, true
}

// sawNode records the foreign checks of one node read: every check of the
// node when the read was whole (prefix ""), or those of the services whose
// ID starts with prefix.
func (c *Client) sawNode(began uint64, node, prefix string, seen []ForeignCheck) {
	c.checks.replace(began, func(n string, f *ForeignCheck) bool {
		return n == node && (prefix == "" || (!f.NodeLevel() && strings.HasPrefix(f.ServiceID, prefix)))
	}, map[string][]ForeignCheck{node: seen})
}

// sawNodes records that nodes are all the owner's nodes: what was seen on
// any other is gone with it.
func (c *Client) sawNodes(began uint64, nodes []string) {
	c.checks.replace(began, func(n string, _ *ForeignCheck) bool { return !slices.Contains(nodes, n) }, nil)
}

// sawService records the foreign checks of one read of Consul service
// name: the node checks of the nodes its instances are on (nodes), and the
// checks of its instances on every node.
func (c *Client) sawService(began uint64, name string, nodes []string, seen map[string][]ForeignCheck) {
	c.checks.replace(began, func(n string, f *ForeignCheck) bool {
		if f.NodeLevel() {
			return slices.Contains(nodes, n)
		}
		return strings.EqualFold(f.ServiceName, name)
	}, seen)
}

// foreignOnNode returns the foreign checks among checks, read on node
// with the services svcs (the node's, or those a prefix read matched).
func (c *Client) foreignOnNode(node string, checks []*wire.Check, svcs []*wire.Service) []ForeignCheck {
	if len(checks) == 0 {
		return nil
	}
	byID := make(map[string]*wire.Service, len(svcs))
	for _, s := range svcs {
		if s != nil {
			byID[s.ID] = s
		}
	}
	var out []ForeignCheck
	for _, hc := range checks {
		var svc *wire.Service
		if hc != nil {
			svc = byID[hc.ServiceID]
		}
		if f, ok := c.foreignOf(node, hc, svc); ok {
			out = append(out, f)
		}
	}
	return out
}

// foreignSeen collects what one read of a service name saw: the nodes of
// its instances, and the foreign checks of its entries (a node check comes
// with every entry of its node: kept once).
type foreignSeen struct {
	nodes  []string // few: a Service's instances share a node
	checks map[string][]ForeignCheck
}

func (s *foreignSeen) node(node string) {
	if !slices.Contains(s.nodes, node) {
		s.nodes = append(s.nodes, node)
	}
}

func (s *foreignSeen) add(c *Client, node string, hc *wire.Check, svc *wire.Service) {
	f, ok := c.foreignOf(node, hc, svc)
	if !ok {
		return
	}
	if s.checks == nil {
		s.checks = map[string][]ForeignCheck{}
	}
	for _, o := range s.checks[node] {
		if o.ServiceID == f.ServiceID && o.CheckID == f.CheckID {
			return
		}
	}
	s.checks[node] = append(s.checks[node], f)
}
