package consul

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/hashicorp/consul/api"
)

// The reads of owned state decode only the fields fleetsync compares.
// Consul answers every catalog service with its Proxy, Connect and
// TaggedAddresses (lan_ipv4 and wan_ipv4, added by Consul itself) and every
// check with its Definition and a copy of the service's tags; decoding those
// into api.AgentService and api.HealthCheck cost most of a restart's CPU at
// 100,000 instances (the restart profile in docs/benchmarks.md).
// encoding/json skips the fields a struct does not name without building
// them. The same goes for a transaction's answer, which echoes every node,
// service and check written: fleetsync needs only their indexes (decoding
// the answer into api.TxnResponse was 20 % of a 10,000-Service cold
// start's CPU). BenchmarkDecode compares the two on Consul's own answers.

// wireService is a service of a catalog read.
type wireService struct {
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

// wireCheck is a check of a health read.
type wireCheck struct {
	CheckID     string
	ServiceID   string // the check is ours only when it is on our service
	Status      string
	Output      string
	Namespace   string
	ModifyIndex uint64
}

// wireNodeServices is /v1/catalog/node-services/:node.
type wireNodeServices struct {
	Services []*wireService
}

// wireEntry is one element of /v1/health/service/:name.
type wireEntry struct {
	Node    *struct{ Node string }
	Service *wireService
	Checks  []*wireCheck
}

// query reads path into out: through rawReads when the adapter has them,
// else through consul/api (both escape the path).
func (a apiAdapter) query(path string, out any, q *api.QueryOptions) (*api.QueryMeta, error) {
	if a.raw != nil {
		return a.raw.query(path, out, q)
	}
	return a.c.Raw().Query(path, out, q)
}

func (a apiAdapter) NodeServices(node string, q *api.QueryOptions) (*wireNodeServices, *api.QueryMeta, error) {
	var out *wireNodeServices
	meta, err := a.query("/v1/catalog/node-services/"+node, &out, q)
	return out, meta, err
}

func (a apiAdapter) NodeChecks(node string, q *api.QueryOptions) ([]*wireCheck, *api.QueryMeta, error) {
	var out []*wireCheck
	meta, err := a.query("/v1/health/node/"+node, &out, q)
	return out, meta, err
}

func (a apiAdapter) ServiceEntries(name string, q *api.QueryOptions) ([]*wireEntry, *api.QueryMeta, error) {
	var out []*wireEntry
	meta, err := a.query("/v1/health/service/"+name, &out, q)
	return out, meta, err
}

func fromWire(node string, s *wireService, hc *wireCheck) Registered {
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

// wireTxnResponse is the answer of /v1/txn: 200 with Results, or 409 with
// Errors (the transaction was rolled back).
type wireTxnResponse struct {
	Results []wireTxnResult
	Errors  api.TxnErrors
}

type wireTxnResult struct {
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

// CommitTxn sends ops as one transaction: through rawReads when the
// adapter has them (body as it is, the answer decoded from a pooled
// buffer), else through consul/api. ok is false when Consul rolled it
// back (409, resp.Errors say why).
func (a apiAdapter) CommitTxn(ops api.TxnOps, body []byte, q *api.QueryOptions) (ok bool, resp *wireTxnResponse, err error) {
	resp = &wireTxnResponse{}
	if a.raw != nil && body != nil {
		err = a.raw.write("/v1/txn", body, resp, q)
	} else {
		w := (&api.WriteOptions{Namespace: q.Namespace, Partition: q.Partition, Datacenter: q.Datacenter, Token: q.Token}).WithContext(q.Context())
		_, err = a.c.Raw().Write("/v1/txn", ops, resp, w)
	}
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusConflict {
		resp = &wireTxnResponse{}
		if jerr := json.Unmarshal([]byte(se.Body), resp); jerr != nil {
			return false, nil, fmt.Errorf("decode the answer of a rolled back transaction: %w", jerr)
		}
		return false, resp, nil
	}
	if err != nil {
		return false, nil, err
	}
	return true, resp, nil
}
