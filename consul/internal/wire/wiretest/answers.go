package wiretest

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/hashicorp/consul/api"
)

// The recorded answers (gzipped under testdata).
const (
	NodeServices = "node-services-1000.json.gz" // /v1/catalog/node-services/<Node>
	NodeChecks   = "health-node-1000.json.gz"   // /v1/health/node/<Node>
	TxnAnswer    = "txn-answer-128.json.gz"     // /v1/txn of TxnOps(63*k, ...)
)

const (
	Node      = "k8s-c1"             // the node the instances are on
	Instances = 1000                 // how many
	ClaimKey  = "fleetsync/claim/c1" // the key of the transactions' check-index op
)

// Path is the file of a recorded answer.
func Path(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", name)
}

// Read returns a recorded answer, unzipped.
func Read(tb testing.TB, name string) []byte {
	tb.Helper()
	f, err := os.Open(Path(name))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Instance is instance i as fleetsync writes an endpoint: ten per
// Kubernetes Service, its meta stamped and described, its check passing
// (the check's ID and name are consul.CheckID's and consul.CheckName).
func Instance(i int) (svc api.AgentService, chk api.HealthCheck) {
	name := fmt.Sprintf("svc-%03d", i/10)
	addr := fmt.Sprintf("10.%d.%d.%d", i/62500, i/250%250, i%250+1)
	id := "k8s_c1_shop_" + name + "_" + addr + "_8080"
	svc = api.AgentService{
		ID: id, Service: name, Address: addr, Port: 8080, Tags: []string{"c1"},
		Meta: map[string]string{
			"external-source": "kubernetes", "k8s-cluster": "c1", "k8s-namespace": "shop", "k8s-service": name,
			"k8s-pod": fmt.Sprintf("%s-5d8f7c9b4-%05d", name, i), "k8s-node": fmt.Sprintf("worker-%d", i%7),
		},
	}
	chk = api.HealthCheck{
		Node: Node, CheckID: "kubernetes-readiness:" + id, Name: "kubernetes-readiness", Status: api.HealthPassing,
		Output: "Kubernetes endpoint is ready", ServiceID: id, ServiceName: name, Type: "kubernetes",
	}
	return svc, chk
}

// TxnOps is a transaction as fleetsync sends one at its largest (128
// ops): the claim's check-index, the node, and 63 instances' service and
// check ops, from instance first on.
func TxnOps(first int, claimIndex uint64) api.TxnOps {
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: ClaimKey, Index: claimIndex}},
		{Node: &api.NodeTxnOp{Verb: api.NodeSet, Node: api.Node{Node: Node, Address: "127.0.0.1",
			Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "c1"}}}},
	}
	for i := first; i < first+63; i++ {
		svc, chk := Instance(i)
		ops = append(ops, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: Node, Service: svc}},
			&api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: chk}})
	}
	return ops
}
