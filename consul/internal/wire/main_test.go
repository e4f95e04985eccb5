package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/internal/agenttest"
	"github.com/fleetsync/fleetsync/test/stack"
)

// agent is a real Consul dev agent for the tests that read Consul's own
// answers; nil under -short.
var agent *stack.Consul

func TestMain(m *testing.M) { os.Exit(agenttest.Main(m, &agent, false)) }

func needConsul(t testing.TB) *stack.Consul { t.Helper(); return agenttest.Need(t, agent) }

// checkID is the ID of an instance's readiness check, as the store names it.
func checkID(serviceID string) string { return "kubernetes-readiness:" + serviceID }

// instance is the service of instance i of name, as the catalog store
// writes one (ID, name, address, port, tags and meta).
func instance(i int, name string) api.AgentService {
	return api.AgentService{
		ID: fmt.Sprintf("test-%s-%d", name, i), Service: name, Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Port: 80,
		Tags: []string{"k8s", "test"}, Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "test"},
	}
}

// instanceOps are the ops that set node (its op first) and each service
// with its readiness check (status passing, output ready unless checks
// names it), as the catalog store writes them.
func instanceOps(node string, svcs []api.AgentService, checks map[string]api.HealthCheck) api.TxnOps {
	ops := api.TxnOps{{Node: &api.NodeTxnOp{Verb: api.NodeSet, Node: api.Node{Node: node, Address: "127.0.0.1",
		Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "test"}}}}}
	for _, s := range svcs {
		hc, ok := checks[s.ID]
		if !ok {
			hc = api.HealthCheck{Status: api.HealthPassing, Output: "ready"}
		}
		hc.Node, hc.CheckID, hc.Name, hc.ServiceID, hc.ServiceName, hc.Type = node, checkID(s.ID), "kubernetes-readiness", s.ID, s.Service, "kubernetes"
		ops = append(ops, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: node, Service: s}},
			&api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: hc}})
	}
	return ops
}

// commitTxn sends ops to a's /v1/txn as they are and returns Consul's
// answer, which must be a commit.
func commitTxn(t testing.TB, a *stack.Consul, ops api.TxnOps) []byte {
	t.Helper()
	body, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPut, a.HTTPAddr+"/v1/txn", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("txn: %d %v %s", resp.StatusCode, err, answer)
	}
	return answer
}

// get GETs path from a and returns the answer, which must be a 200.
func get(t testing.TB, a *stack.Consul, path string) []byte {
	t.Helper()
	resp, err := http.Get(a.HTTPAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	return body
}
