package consul

import (
	"maps"
	"slices"

	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// Readiness check of every instance.
const (
	CheckName       = "kubernetes-readiness"
	checkIDPrefix   = "kubernetes-readiness:"
	StatusPassing   = "passing"
	StatusWarning   = "warning"
	StatusCritical  = "critical"
	defaultMaxOps   = 128
	defaultMaxBytes = 384 << 10
)

// CheckID returns the ID of the readiness check of instance id.
func CheckID(instanceID string) string { return checkIDPrefix + instanceID }

// Node is a Consul catalog node.
type Node struct {
	Name    string
	Address string
	Meta    map[string]string
}

// Check is the state of an instance's readiness check.
type Check struct {
	Status string `json:"status"` // passing, warning or critical
	Output string `json:"output"`
}

// Instance is one service instance as fleetsync wants it in Consul.
type Instance struct {
	ID      string            `json:"id"`
	Name    string            `json:"name"` // Consul service name
	Address string            `json:"address"`
	Port    int               `json:"port"`
	Weight  int               `json:"weight,omitempty"` // Weights.Passing; 0: Consul's default (1)
	Tags    []string          `json:"tags"`
	Meta    map[string]string `json:"meta"`
	Check   Check             `json:"check"`
}

// SameService reports whether the service parts (everything but the check)
// of a and b are equal. Tag order is significant, as it is in Consul.
func (a Instance) SameService(b Instance) bool {
	return a.ID == b.ID && a.Name == b.Name && a.Address == b.Address && a.Port == b.Port && a.Weight == b.Weight &&
		slices.Equal(a.Tags, b.Tags) && maps.Equal(a.Meta, b.Meta)
}

// Equal reports whether a and b are the same in every field Consul stores.
func (a Instance) Equal(b Instance) bool {
	return a.SameService(b) && a.Check == b.Check
}

// Registered is an instance as read from (or written to) Consul, with the
// indexes its next update or delete must be conditional on.
type Registered struct {
	Instance
	Node         string
	Namespace    string // Consul namespace (Enterprise; "" for the default)
	ServiceIndex uint64 // ModifyIndex of the service entry
	CheckIndex   uint64 // ModifyIndex of the readiness check; 0 if it has none
	HasCheck     bool
}

// Update is a change to an instance that exists: Want replaces Have.
type Update struct {
	Want Instance
	Have Registered
}

// Change is what one flush writes: the difference between desired and owned.
type Change struct {
	Register   []Instance   // absent from Consul: created with CAS index 0
	Update     []Update     // present but different: CAS on the read indexes
	Deregister []Registered // present but not desired: delete-CAS
	// High asks the write budget for priority (see budget.Budget).
	High bool
	// Permit, when the caller already acquired one (Client.Acquire), pays
	// for the first transaction; Apply acquires the rest and releases all.
	Permit budget.Permit
	// NodeFor names the node each registered instance goes on (nil: the
	// owner's NodeNameFor); a node that is not the owner's is refused.
	NodeFor func(instanceID string) string
	// Fence, when set, makes each of the change's transactions also
	// conditional on the fencing token of the shard the change belongs to
	// (consul/fence), in an op right after the claim's. When it fails and
	// the fence's Failed confirms another replica took the shard, Apply
	// returns a *TxnError that matches ErrFenced and sends nothing more.
	Fence Guard
}

// Empty reports whether the change writes nothing.
func (c Change) Empty() bool {
	return len(c.Register) == 0 && len(c.Update) == 0 && len(c.Deregister) == 0
}

// Len returns the number of instances the change touches.
func (c Change) Len() int { return len(c.Register) + len(c.Update) + len(c.Deregister) }

// fromWire is the Registered of service s on node, with its readiness
// check hc (nil: none).
func fromWire(node string, s *wire.Service, hc *wire.Check) Registered {
	r := Registered{
		Instance: Instance{
			ID:      s.ID,
			Name:    s.Service,
			Address: s.Address,
			Port:    s.Port,
			Weight:  weightOf(s.Weights),
			Tags:    s.Tags,
			Meta:    s.Meta,
		},
		Node:         node,
		Namespace:    s.Namespace,
		ServiceIndex: s.ModifyIndex,
	}
	if len(r.Tags) == 0 {
		r.Tags = nil
	}
	if len(r.Meta) == 0 {
		r.Meta = nil
	}
	if hc != nil {
		r.HasCheck = true
		r.CheckIndex = hc.ModifyIndex
		r.Check = Check{Status: hc.Status, Output: hc.Output}
	}
	return r
}
