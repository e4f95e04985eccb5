package wire

import "github.com/hashicorp/consul/api"

// The reads of owned state decode only the fields fleetsync compares.
// Consul answers every catalog service with its Proxy, Connect and
// TaggedAddresses (lan_ipv4 and wan_ipv4, added by Consul itself) and every
// check with its Definition and a copy of the service's tags; decoding those
// into api.AgentService and api.HealthCheck cost most of a restart's CPU at
// 100,000 instances.
// encoding/json skips the fields a struct does not name without building
// them. The same goes for a transaction's answer, which echoes every node,
// service and check written: fleetsync needs only their indexes (decoding
// the answer into api.TxnResponse was 20 % of a 10,000-Service cold
// start's CPU). BenchmarkDecode compares the two on Consul's own answers.

// Service is a service of a catalog read.
type Service struct {
	ID          string
	Service     string
	Address     string
	Port        int
	Weights     api.AgentWeights
	Tags        []string
	Meta        map[string]string
	Namespace   string
	ModifyIndex uint64
}

// Check is a check of a health read.
type Check struct {
	CheckID     string
	ServiceID   string // the check is ours only when it is on our service
	Status      string
	Output      string
	Namespace   string
	ModifyIndex uint64
}

// NodeServices is /v1/catalog/node-services/:node.
type NodeServices struct {
	Services []*Service
}

// Entry is one element of /v1/health/service/:name.
type Entry struct {
	Node    *struct{ Node string }
	Service *Service
	Checks  []*Check
}

// TxnResponse is the answer of /v1/txn: 200 with Results, or 409 with
// Errors (the transaction was rolled back).
type TxnResponse struct {
	Results []TxnResult
	Errors  api.TxnErrors
}

type TxnResult struct {
	Node *struct {
		Node                     string
		Address                  string
		Meta                     map[string]string
		CreateIndex, ModifyIndex uint64
	}
	Service *struct {
		ID          string
		ModifyIndex uint64
	}
	Check *struct {
		CheckID     string
		ModifyIndex uint64
	}
}
