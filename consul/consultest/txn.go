package consultest

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/hashicorp/consul/api"
)

// txn is one transaction's working copy of the state.
type txn struct {
	s       *Server
	idx     uint64
	nodes   map[string]*node
	kv      map[string]*api.KVPair
	indexes map[string]uint64
}

// The reasons Consul gives (agent/consul/state/catalog.go), word for word.
var (
	errMissingNode    = errors.New("Missing node registration")    //lint:ignore ST1005 Consul's text
	errMissingService = errors.New("Missing service registration") //lint:ignore ST1005 Consul's text
)

func (t *txn) bump(names ...string) {
	for _, n := range names {
		t.indexes[n] = max(t.indexes[n], t.idx)
	}
}

func (t *txn) do(op *api.TxnOp) (*api.TxnResult, error) {
	if err := t.s.missingNamespace(op); err != nil {
		return nil, err
	}
	switch {
	case op.KV != nil:
		return t.kvOp(op.KV)
	case op.Node != nil:
		return t.nodeOp(op.Node)
	case op.Service != nil:
		return t.serviceOp(op.Service)
	case op.Check != nil:
		return t.checkOp(op.Check)
	}
	return nil, errors.New("no operation specified")
}

func (t *txn) nodeOp(op *api.NodeTxnOp) (*api.TxnResult, error) {
	name := op.Node.Node
	cur := t.nodes[name]
	result := func() (*api.TxnResult, error) { return &api.TxnResult{Node: cloneNode(&t.nodes[name].Node)}, nil }
	switch op.Verb {
	case api.NodeGet:
		if cur == nil {
			return nil, fmt.Errorf("node %q doesn't exist", name)
		}
		return result()
	case api.NodeSet:
		t.ensureNode(op.Node)
		return result()
	case api.NodeCAS:
		if !casMatches(cur != nil, func() uint64 { return cur.ModifyIndex }, op.Node.ModifyIndex) {
			return nil, fmt.Errorf("failed to set node %q, index is stale", name)
		}
		t.ensureNode(op.Node)
		return result()
	case api.NodeDelete:
		t.deleteNode(name)
		return nil, nil
	case api.NodeDeleteCAS:
		if cur == nil || cur.ModifyIndex != op.Node.ModifyIndex {
			return nil, fmt.Errorf("failed to delete node %q, index is stale", name)
		}
		t.deleteNode(name)
		return nil, nil
	}
	return nil, fmt.Errorf("unknown Node verb %q", op.Verb)
}

// casMatches is Consul's CAS rule: index 0 means "only if absent", else the
// entry must exist at that ModifyIndex.
func casMatches(exists bool, modify func() uint64, index uint64) bool {
	if index == 0 {
		return !exists
	}
	return exists && modify() == index
}

// ensureNode writes the node record: it replaces address, meta and tagged
// addresses; an identical record keeps its indexes.
func (t *txn) ensureNode(in api.Node) {
	rec := api.Node{Node: in.Node, ID: in.ID, Address: in.Address, Datacenter: in.Datacenter,
		TaggedAddresses: maps.Clone(in.TaggedAddresses), Meta: maps.Clone(in.Meta), Partition: in.Partition}
	cur := t.nodes[in.Node]
	if cur != nil {
		rec.CreateIndex, rec.ModifyIndex = cur.CreateIndex, cur.ModifyIndex
		if sameNode(&cur.Node, &rec) {
			return
		}
		rec.ModifyIndex = t.idx
		cur.Node = rec
	} else {
		rec.CreateIndex, rec.ModifyIndex = t.idx, t.idx
		t.nodes[in.Node] = &node{Node: rec, services: map[string]*api.AgentService{}, checks: map[string]*api.HealthCheck{}}
	}
	t.bump("nodes", "node."+in.Node)
	t.bumpNames(t.nodes[in.Node]) // node data is part of health reads
}

func sameNode(a, b *api.Node) bool {
	return a.ID == b.ID && a.Node == b.Node && a.Address == b.Address && a.Datacenter == b.Datacenter &&
		emptyEqual(a.TaggedAddresses, b.TaggedAddresses) && emptyEqual(a.Meta, b.Meta)
}

func emptyEqual[M ~map[K]V, K, V comparable](a, b M) bool {
	return len(a) == len(b) && maps.Equal(a, b)
}

func (t *txn) deleteNode(name string) {
	n := t.nodes[name]
	if n == nil {
		return
	}
	if len(n.services) > 0 {
		t.bump("services")
		t.bumpNames(n)
	}
	if len(n.checks) > 0 {
		t.bump("checks")
	}
	delete(t.nodes, name)
	delete(t.indexes, "node."+name)
	t.bump("nodes", "node_last_extinction")
}

func (t *txn) serviceOp(op *api.ServiceTxnOp) (*api.TxnResult, error) {
	n := t.nodes[op.Node]
	id := op.Service.ID
	var cur *api.AgentService
	if n != nil {
		cur = n.services[id]
	}
	result := func() (*api.TxnResult, error) {
		return &api.TxnResult{Service: cloneService(t.nodes[op.Node].services[id])}, nil
	}
	switch op.Verb {
	case api.ServiceGet:
		if cur == nil {
			return nil, fmt.Errorf("service %q on node %q doesn't exist", id, op.Node)
		}
		return result()
	case api.ServiceSet:
		if err := t.ensureService(op.Node, op.Service); err != nil {
			return nil, err
		}
		return result()
	case api.ServiceCAS:
		if !casMatches(cur != nil, func() uint64 { return cur.ModifyIndex }, op.Service.ModifyIndex) {
			return nil, fmt.Errorf("failed to set service %q on node %q, index is stale", id, op.Node)
		}
		if err := t.ensureService(op.Node, op.Service); err != nil {
			return nil, err
		}
		return result()
	case api.ServiceDelete:
		t.deleteService(op.Node, id)
		return nil, nil
	case api.ServiceDeleteCAS:
		if cur == nil || cur.ModifyIndex != op.Service.ModifyIndex {
			return nil, fmt.Errorf("failed to delete service %q on node %q, index is stale", id, op.Node)
		}
		t.deleteService(op.Node, id)
		return nil, nil
	}
	return nil, fmt.Errorf("unknown Service verb %q", op.Verb)
}

// ensureService writes a service on an existing node; an identical entry
// keeps its indexes.
func (t *txn) ensureService(nodeName string, in api.AgentService) error {
	n := t.nodes[nodeName]
	if n == nil {
		return errMissingNode
	}
	if in.ID == "" {
		in.ID = in.Service
	}
	for k := range in.Meta {
		if k == "" {
			//lint:ignore ST1005 Consul's text
			return fmt.Errorf("Invalid Service Meta for node %s and serviceID %s: Couldn't load metadata pair ('', '%s'): Key cannot be blank", nodeName, in.ID, in.Meta[k])
		}
		if len(in.Meta[k]) > 512 {
			//lint:ignore ST1005 Consul's text
			return fmt.Errorf("Invalid Service Meta for node %s and serviceID %s: Value is too long (limit: 512 characters)", nodeName, in.ID)
		}
	}
	rec := &api.AgentService{ID: in.ID, Service: in.Service, Kind: in.Kind, Tags: slices.Clone(in.Tags), Meta: maps.Clone(in.Meta),
		Port: in.Port, Address: in.Address, TaggedAddresses: maps.Clone(in.TaggedAddresses), Weights: in.Weights,
		EnableTagOverride: in.EnableTagOverride, Namespace: in.Namespace, Partition: in.Partition, Datacenter: in.Datacenter}
	if rec.Weights == (api.AgentWeights{}) {
		rec.Weights = api.AgentWeights{Passing: 1, Warning: 1} // Consul's default
	}
	if cur := n.services[in.ID]; cur != nil {
		rec.CreateIndex, rec.ModifyIndex = cur.CreateIndex, cur.ModifyIndex
		if sameService(cur, rec) {
			return nil
		}
		rec.ModifyIndex = t.idx
	} else {
		rec.CreateIndex, rec.ModifyIndex = t.idx, t.idx
	}
	n.services[in.ID] = rec
	t.bump("service." + rec.Service) // the new name's only, as Consul (a rename leaves the old name's)
	// Consul raises the nodes table's index with every service write too
	// (catalogInsertService: the services are part of node reads).
	t.bump("services", "nodes", "node."+nodeName)
	return nil
}

func sameService(a, b *api.AgentService) bool {
	return a.ID == b.ID && a.Service == b.Service && a.Kind == b.Kind && slices.Equal(a.Tags, b.Tags) &&
		emptyEqual(a.Meta, b.Meta) && a.Port == b.Port && a.Address == b.Address &&
		reflect.DeepEqual(a.TaggedAddresses, b.TaggedAddresses) && a.Weights == b.Weights && a.EnableTagOverride == b.EnableTagOverride
}

// deleteService removes a service and its checks (absent: nothing happens).
func (t *txn) deleteService(nodeName, id string) {
	n := t.nodes[nodeName]
	if n == nil || n.services[id] == nil {
		return
	}
	t.bump("service." + n.services[id].Service)
	delete(n.services, id)
	for cid, hc := range n.checks {
		if hc.ServiceID == id {
			delete(n.checks, cid)
			t.bump("checks")
		}
	}
	// Consul raises the checks table's index with every service delete,
	// checks or none (deleteServiceTxn).
	t.bump("services", "nodes", "checks", "node."+nodeName, "service_last_extinction")
}

func (t *txn) checkOp(op *api.CheckTxnOp) (*api.TxnResult, error) {
	in := op.Check
	n := t.nodes[in.Node]
	var cur *api.HealthCheck
	if n != nil {
		cur = n.checks[in.CheckID]
	}
	result := func() (*api.TxnResult, error) {
		return &api.TxnResult{Check: cloneCheck(t.nodes[in.Node].checks[in.CheckID])}, nil
	}
	switch op.Verb {
	case api.CheckGet:
		if cur == nil {
			return nil, fmt.Errorf("check %q on node %q doesn't exist", in.CheckID, in.Node)
		}
		return result()
	case api.CheckSet:
		if err := t.ensureCheck(in); err != nil {
			return nil, err
		}
		return result()
	case api.CheckCAS:
		if !casMatches(cur != nil, func() uint64 { return cur.ModifyIndex }, in.ModifyIndex) {
			return nil, fmt.Errorf("failed to set check %q on node %q, index is stale", in.CheckID, in.Node)
		}
		if err := t.ensureCheck(in); err != nil {
			// Consul 1.14 loses this error (txnCheck overwrites it with
			// the lookup's): the op succeeds, writes nothing and has no
			// result.
			return nil, nil
		}
		return result()
	case api.CheckDelete:
		t.deleteCheck(in.Node, in.CheckID)
		return nil, nil
	case api.CheckDeleteCAS:
		if cur == nil || cur.ModifyIndex != in.ModifyIndex {
			return nil, fmt.Errorf("failed to delete check %q on node %q, index is stale", in.CheckID, in.Node)
		}
		t.deleteCheck(in.Node, in.CheckID)
		return nil, nil
	}
	return nil, fmt.Errorf("unknown Check verb %q", op.Verb)
}

// ensureCheck writes a check on an existing node (and service, for a
// service check); it takes the service's name and tags, defaults the status
// to critical, and keeps its indexes when nothing changed.
func (t *txn) ensureCheck(in api.HealthCheck) error {
	n := t.nodes[in.Node]
	if n == nil {
		return errMissingNode
	}
	rec := &api.HealthCheck{Node: in.Node, CheckID: in.CheckID, Name: in.Name, Status: in.Status, Notes: in.Notes,
		Output: in.Output, ServiceID: in.ServiceID, Namespace: in.Namespace, Partition: in.Partition} // a txn drops Type
	if rec.Status == "" {
		rec.Status = api.HealthCritical
	}
	if in.ServiceID != "" {
		svc := n.services[in.ServiceID]
		if svc == nil {
			return errMissingService
		}
		rec.ServiceName, rec.ServiceTags = svc.Service, slices.Clone(svc.Tags)
	}
	if cur := n.checks[in.CheckID]; cur != nil {
		rec.CreateIndex, rec.ModifyIndex = cur.CreateIndex, cur.ModifyIndex
		if sameCheck(cur, rec) {
			return nil
		}
		rec.ModifyIndex = t.idx
	} else {
		rec.CreateIndex, rec.ModifyIndex = t.idx, t.idx
	}
	n.checks[in.CheckID] = rec
	t.bump("checks")
	t.bumpCheckNames(n, rec)
	return nil
}

// bumpCheckNames raises the index of the name a check's service has, or of
// every name on the node for a node check (Consul's ensureCheckTxn).
func (t *txn) bumpCheckNames(n *node, hc *api.HealthCheck) {
	if hc.ServiceID == "" {
		t.bumpNames(n)
		return
	}
	if svc := n.services[hc.ServiceID]; svc != nil {
		t.bump("service." + svc.Service)
	}
}

// bumpNames raises the index of every service name on the node.
func (t *txn) bumpNames(n *node) {
	for _, svc := range n.services {
		t.bump("service." + svc.Service)
	}
}

func sameCheck(a, b *api.HealthCheck) bool {
	return a.Node == b.Node && a.CheckID == b.CheckID && a.Name == b.Name && a.Status == b.Status && a.Notes == b.Notes &&
		a.Output == b.Output && a.ServiceID == b.ServiceID && a.ServiceName == b.ServiceName &&
		slices.Equal(a.ServiceTags, b.ServiceTags) && a.Type == b.Type
}

func (t *txn) deleteCheck(nodeName, id string) {
	n := t.nodes[nodeName]
	if n == nil || n.checks[id] == nil {
		return
	}
	t.bumpCheckNames(n, n.checks[id])
	delete(n.checks, id)
	t.bump("checks")
}
