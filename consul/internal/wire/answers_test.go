package wire

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/stack"
)

// The answers of a real Consul 1.14 server agent (not -dev, which indents
// its JSON) for one crowded node, kept gzipped in testdata and written by
// TestCaptureConsulAnswers:
//
//	FLEETSYNC_CAPTURE_ANSWERS=1 FLEETSYNC_TOOLS_BIN=... go test -run TestCaptureConsulAnswers ./consul/internal/wire
const (
	answerNode         = "k8s-c1"
	answerInstances    = 1000
	answerNodeServices = "testdata/node-services-1000.json.gz"
	answerNodeChecks   = "testdata/health-node-1000.json.gz"
	answerTxn          = "testdata/txn-answer-128.json.gz"
	claimKey           = "fleetsync/claim/c1"
)

// answerInstance is instance i as fleetsync writes an endpoint: ten per
// Kubernetes Service, its meta stamped and described, its check passing
// (the check's ID and name are consul.CheckID's and consul.CheckName).
func answerInstance(i int) (svc api.AgentService, chk api.HealthCheck) {
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
		Node: answerNode, CheckID: "kubernetes-readiness:" + id, Name: "kubernetes-readiness", Status: api.HealthPassing, Output: "Kubernetes endpoint is ready",
		ServiceID: id, ServiceName: name, Type: "kubernetes",
	}
	return svc, chk
}

// answerTxnOps is a transaction as fleetsync sends one at its largest
// (128 ops): the claim's check-index, the node, and 63 instances' service
// and check ops, starting at instance first.
func answerTxnOps(first int, claimIndex uint64) api.TxnOps {
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: claimKey, Index: claimIndex}},
		{Node: &api.NodeTxnOp{Verb: api.NodeSet, Node: api.Node{Node: answerNode, Address: "127.0.0.1",
			Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "c1"}}}},
	}
	for i := first; i < first+63; i++ {
		svc, chk := answerInstance(i)
		ops = append(ops, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: answerNode, Service: svc}},
			&api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckSet, Check: chk}})
	}
	return ops
}

func readAnswer(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCaptureConsulAnswers registers answerInstances instances on a fresh
// Consul server agent through /v1/txn, as fleetsync does, and saves the
// agent's answers to the reads of that node and to one 128-op transaction.
func TestCaptureConsulAnswers(t *testing.T) {
	if os.Getenv("FLEETSYNC_CAPTURE_ANSWERS") == "" {
		t.Skip("set FLEETSYNC_CAPTURE_ANSWERS=1 to capture the answers again")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c, err := stack.StartConsul(ctx, stack.ConsulOptions{Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	do := func(method, path string, body []byte) []byte {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, c.HTTPAddr+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %v %s", method, path, resp.StatusCode, err, b)
		}
		return b
	}
	do(http.MethodPut, "/v1/kv/"+claimKey, []byte("c1"))
	var kv []struct{ ModifyIndex uint64 }
	if err := json.Unmarshal(do(http.MethodGet, "/v1/kv/"+claimKey, nil), &kv); err != nil || len(kv) != 1 {
		t.Fatalf("the claim key: %v %v", kv, err)
	}
	var txnAnswer []byte
	for first := 0; first < answerInstances; first += 63 {
		ops := answerTxnOps(first, kv[0].ModifyIndex)
		if over := first + 63 - answerInstances; over > 0 {
			ops = ops[:len(ops)-2*over]
		}
		body, err := json.Marshal(ops)
		if err != nil {
			t.Fatal(err)
		}
		answer := do(http.MethodPut, "/v1/txn", body)
		if len(ops) == 128 {
			txnAnswer = answer
		}
	}
	services := do(http.MethodGet, "/v1/catalog/node-services/"+answerNode, nil)
	checks := do(http.MethodGet, "/v1/health/node/"+answerNode, nil)
	var list api.CatalogNodeServiceList
	var hcs api.HealthChecks
	if err := json.Unmarshal(services, &list); err != nil || len(list.Services) != answerInstances {
		t.Fatalf("node services: %d, %v", len(list.Services), err)
	}
	if err := json.Unmarshal(checks, &hcs); err != nil || len(hcs) != answerInstances {
		t.Fatalf("node checks: %d, %v", len(hcs), err)
	}
	for path, b := range map[string][]byte{answerNodeServices: services, answerNodeChecks: checks, answerTxn: txnAnswer} {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		if _, err := zw.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes (%d gzipped)", path, len(b), buf.Len())
	}
}
