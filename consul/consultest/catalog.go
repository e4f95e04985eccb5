package consultest

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"

	"github.com/hashicorp/consul/api"
)

func (s *Server) serveNodes(w http.ResponseWriter, r *http.Request) {
	var list []*api.Node
	for _, name := range slices.Sorted(maps.Keys(s.nodes)) {
		if n := s.nodes[name]; metaMatches(r, n.Meta) {
			list = append(list, cloneNode(&n.Node))
		}
	}
	list, ok := filter(w, r, list)
	if !ok {
		return
	}
	writeJSON(w, s.max("nodes"), list)
}

func (s *Server) serveNode(w http.ResponseWriter, _ *http.Request, name string) {
	n := s.nodes[name]
	if n == nil {
		writeJSON(w, s.max("nodes"), "null")
		return
	}
	out := &api.CatalogNode{Node: cloneNode(&n.Node), Services: map[string]*api.AgentService{}}
	for id, svc := range n.services {
		out.Services[id] = cloneService(svc)
	}
	writeJSON(w, s.max("nodes"), out)
}

func (s *Server) serveNodeServices(w http.ResponseWriter, r *http.Request, name string) {
	n := s.nodes[name]
	if n == nil {
		writeJSON(w, s.max("node_last_extinction"), &api.CatalogNodeServiceList{})
		return
	}
	var svcs []*api.AgentService
	for _, id := range slices.Sorted(maps.Keys(n.services)) {
		svcs = append(svcs, cloneService(n.services[id]))
	}
	svcs, ok := filter(w, r, svcs)
	if !ok {
		return
	}
	if svcs == nil {
		svcs = []*api.AgentService{}
	}
	writeJSON(w, s.max("node."+name), &api.CatalogNodeServiceList{Node: cloneNode(&n.Node), Services: svcs})
}

func (s *Server) serveNodeChecks(w http.ResponseWriter, r *http.Request, name string) {
	checks := api.HealthChecks{}
	if n := s.nodes[name]; n != nil {
		for _, id := range slices.Sorted(maps.Keys(n.checks)) {
			checks = append(checks, cloneCheck(n.checks[id]))
		}
	}
	checks, ok := filter(w, r, checks)
	if !ok {
		return
	}
	writeJSON(w, s.max("checks"), checks)
}

func (s *Server) serveHealthService(w http.ResponseWriter, r *http.Request, name string) {
	out := []*api.ServiceEntry{}
	for _, nn := range slices.Sorted(maps.Keys(s.nodes)) {
		n := s.nodes[nn]
		if !metaMatches(r, n.Meta) {
			continue
		}
		for _, id := range slices.Sorted(maps.Keys(n.services)) {
			svc := n.services[id]
			if svc.Service != name {
				continue
			}
			e := &api.ServiceEntry{Node: cloneNode(&n.Node), Service: cloneService(svc), Checks: api.HealthChecks{}}
			for _, cid := range slices.Sorted(maps.Keys(n.checks)) {
				if hc := n.checks[cid]; hc.ServiceID == "" || hc.ServiceID == id {
					e.Checks = append(e.Checks, cloneCheck(hc))
				}
			}
			out = append(out, e)
		}
	}
	writeJSON(w, s.serviceIndex(name), out)
}

func (s *Server) serveRegister(w http.ResponseWriter, r *http.Request) {
	var reg api.CatalogRegistration
	if err := json.NewDecoder(r.Body).Decode(&reg); err != nil {
		http.Error(w, "Request decode failed: "+err.Error(), http.StatusBadRequest)
		return
	}
	ops := api.TxnOps{}
	if !reg.SkipNodeUpdate || s.nodes[reg.Node] == nil {
		ops = append(ops, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet, Node: api.Node{
			Node: reg.Node, Address: reg.Address, Meta: reg.NodeMeta, TaggedAddresses: reg.TaggedAddresses, Datacenter: reg.Datacenter}}})
	}
	if reg.Service != nil {
		ops = append(ops, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: reg.Node, Service: *reg.Service}})
	}
	if c := reg.Check; c != nil {
		reg.Checks = append(reg.Checks, &api.HealthCheck{CheckID: c.CheckID, Name: c.Name, Status: c.Status, Notes: c.Notes,
			Output: c.Output, ServiceID: c.ServiceID, Type: c.Type, Namespace: c.Namespace, Partition: c.Partition})
	}
	for _, hc := range reg.Checks {
		c := *hc
		c.Node = reg.Node
		ops = append(ops, &api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: c}})
	}
	if _, errs := s.apply(ops); len(errs) > 0 {
		http.Error(w, errs[0].What, http.StatusInternalServerError)
		return
	}
	writeJSON(w, 0, "true")
}

func (s *Server) serveDeregister(w http.ResponseWriter, r *http.Request) {
	var d api.CatalogDeregistration
	if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
		http.Error(w, "Request decode failed: "+err.Error(), http.StatusBadRequest)
		return
	}
	var op *api.TxnOp
	switch {
	case d.ServiceID != "":
		op = &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceDelete, Node: d.Node, Service: api.AgentService{ID: d.ServiceID}}}
	case d.CheckID != "":
		op = &api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckDelete, Check: api.HealthCheck{Node: d.Node, CheckID: d.CheckID}}}
	default:
		op = &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeDelete, Node: api.Node{Node: d.Node}}}
	}
	if _, errs := s.apply(api.TxnOps{op}); len(errs) > 0 {
		http.Error(w, errs[0].What, http.StatusInternalServerError)
		return
	}
	writeJSON(w, 0, "true")
}

// serviceIndex is a name's own index (raised by every write of a service or
// check of that name, and of the node one is on), or, with no instance of
// the name anywhere, the last time a name lost its last instance (Consul's
// maxIndexAndWatchChForService).
func (s *Server) serviceIndex(name string) uint64 {
	for _, n := range s.nodes {
		for _, svc := range n.services {
			if svc.Service == name {
				return s.max("service." + name)
			}
		}
	}
	return s.max("service_last_extinction")
}
