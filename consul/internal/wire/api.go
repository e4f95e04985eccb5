package wire

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"github.com/hashicorp/consul/api"
)

// API is what the catalog store asks of Consul, through a consul/api
// client; with Raw, the reads of owned state and the transactions skip
// consul/api's decoding (Raw).
type API struct {
	C   *api.Client
	Raw *Raw
}

func (a API) NodeServiceList(node string, q *api.QueryOptions) (*api.CatalogNodeServiceList, *api.QueryMeta, error) {
	var out *api.CatalogNodeServiceList
	meta, err := a.query("/v1/catalog/node-services/"+node, &out, q)
	return out, meta, err
}

func (a API) HealthNode(node string, q *api.QueryOptions) (api.HealthChecks, *api.QueryMeta, error) {
	var out api.HealthChecks
	meta, err := a.query("/v1/health/node/"+node, &out, q)
	return out, meta, err
}

func (a API) CatalogNode(node string, q *api.QueryOptions) (*api.CatalogNode, *api.QueryMeta, error) {
	var out *api.CatalogNode
	meta, err := a.query("/v1/catalog/node/"+node, &out, q)
	return out, meta, err
}

func (a API) CatalogNodes(q *api.QueryOptions) ([]*api.Node, *api.QueryMeta, error) {
	var out []*api.Node
	meta, err := a.query("/v1/catalog/nodes", &out, q)
	return out, meta, err
}

func (a API) KVGet(key string, q *api.QueryOptions) (*api.KVPair, *api.QueryMeta, error) {
	return a.C.KV().Get(key, q)
}

func (a API) Txn(ops api.TxnOps, q *api.QueryOptions) (bool, *api.TxnResponse, *api.QueryMeta, error) {
	return a.C.Txn().Txn(ops, q)
}

// query reads path into out: through Raw when the API has it, else
// through consul/api (both escape the path, and send the same request).
// Either way an answer a reader could not use (checkAnswer) is an
// ErrBadAnswer naming path; Raw also bounds the answer's size.
func (a API) query(path string, out any, q *api.QueryOptions) (*api.QueryMeta, error) {
	if a.Raw != nil {
		return a.Raw.query(path, out, q)
	}
	meta, err := a.C.Raw().Query(path, out, q)
	var se api.StatusError
	var ue *url.Error
	switch {
	case err != nil && !errors.As(err, &se) && !errors.As(err, &ue):
		return nil, answerError(http.MethodGet, path, "not the JSON expected", err)
	case err != nil:
		return nil, err
	}
	if where := checkAnswer(out); where != "" {
		return nil, answerError(http.MethodGet, path, where, nil)
	}
	return meta, nil
}

func (a API) NodeServices(node string, q *api.QueryOptions) (*NodeServices, *api.QueryMeta, error) {
	var out *NodeServices
	meta, err := a.query("/v1/catalog/node-services/"+node, &out, q)
	return out, meta, err
}

func (a API) NodeChecks(node string, q *api.QueryOptions) ([]*Check, *api.QueryMeta, error) {
	var out []*Check
	meta, err := a.query("/v1/health/node/"+node, &out, q)
	return out, meta, err
}

func (a API) ServiceEntries(name string, q *api.QueryOptions) ([]*Entry, *api.QueryMeta, error) {
	var out []*Entry
	meta, err := a.query("/v1/health/service/"+name, &out, q)
	return out, meta, err
}

// CommitTxn sends ops as one transaction: through Raw when the API
// has it (body as it is, the answer decoded from a pooled
// buffer), else through consul/api. ok is false when Consul rolled it
// back (409, resp.Errors say why).
func (a API) CommitTxn(ops api.TxnOps, body []byte, q *api.QueryOptions) (ok bool, resp *TxnResponse, err error) {
	resp = &TxnResponse{}
	if a.Raw != nil && body != nil {
		err = a.Raw.write("/v1/txn", body, resp, q)
	} else {
		w := (&api.WriteOptions{Namespace: q.Namespace, Partition: q.Partition, Datacenter: q.Datacenter, Token: q.Token}).WithContext(q.Context())
		_, err = a.C.Raw().Write("/v1/txn", ops, resp, w)
	}
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusConflict {
		resp = &TxnResponse{}
		if jerr := json.Unmarshal([]byte(se.Body), resp); jerr != nil {
			return false, nil, answerError(http.MethodPut, "/v1/txn", "decode the answer of a rolled back transaction", jerr)
		}
		if where := checkAnswer(resp); where != "" {
			return false, nil, answerError(http.MethodPut, "/v1/txn", where, nil)
		}
		return false, resp, nil
	}
	if err != nil {
		return false, nil, err
	}
	return true, resp, nil
}
