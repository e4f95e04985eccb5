package wire

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/internal/wire/wiretest"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestCaptureConsulAnswers registers wiretest's instances on a fresh
// Consul server agent (not -dev, which indents its JSON) through /v1/txn,
// as fleetsync does, and saves the agent's answers to the reads of that
// node and to one 128-op transaction into wiretest/testdata:
//
//	FLEETSYNC_CAPTURE_ANSWERS=1 FLEETSYNC_TOOLS_BIN=... go test -run TestCaptureConsulAnswers ./consul/internal/wire
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
	do(http.MethodPut, "/v1/kv/"+wiretest.ClaimKey, []byte("c1"))
	var kv []struct{ ModifyIndex uint64 }
	if err := json.Unmarshal(do(http.MethodGet, "/v1/kv/"+wiretest.ClaimKey, nil), &kv); err != nil || len(kv) != 1 {
		t.Fatalf("the claim key: %v %v", kv, err)
	}
	var txnAnswer []byte
	for first := 0; first < wiretest.Instances; first += 63 {
		ops := wiretest.TxnOps(first, kv[0].ModifyIndex)
		if over := first + 63 - wiretest.Instances; over > 0 {
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
	services := do(http.MethodGet, "/v1/catalog/node-services/"+wiretest.Node, nil)
	checks := do(http.MethodGet, "/v1/health/node/"+wiretest.Node, nil)
	var list api.CatalogNodeServiceList
	var hcs api.HealthChecks
	if err := json.Unmarshal(services, &list); err != nil || len(list.Services) != wiretest.Instances {
		t.Fatalf("node services: %d, %v", len(list.Services), err)
	}
	if err := json.Unmarshal(checks, &hcs); err != nil || len(hcs) != wiretest.Instances {
		t.Fatalf("node checks: %d, %v", len(hcs), err)
	}
	for name, b := range map[string][]byte{wiretest.NodeServices: services, wiretest.NodeChecks: checks, wiretest.TxnAnswer: txnAnswer} {
		var buf bytes.Buffer
		zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := zw.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(wiretest.Path(name), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes (%d gzipped)", name, len(b), buf.Len())
	}
}
