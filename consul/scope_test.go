package consul

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/conn"
)

// shapeServer answers the catalog, health and txn requests a Client
// makes with well-formed empty or minimal results, and
// records each request: method, path, query and body. Consul Enterprise
// cannot run here, so these shapes are what the namespace and partition
// support is tested on.
type shapeServer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []shapeReq
}

type shapeReq struct{ method, path, query, body string }

func (r shapeReq) String() string { return r.method + " " + r.path + "?" + sortedQuery(r.query) }

// sortedQuery orders repeated parameters too (consul/api writes node-meta
// from a map, in no fixed order).
func sortedQuery(q string) string {
	v, _ := url.ParseQuery(q)
	for _, vs := range v {
		sort.Strings(vs)
	}
	return v.Encode()
}

func newShapeServer(t *testing.T) *shapeServer {
	s := &shapeServer{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reqs = append(s.reqs, shapeReq{r.Method, r.URL.Path, r.URL.RawQuery, string(b)})
		w.Header().Set("X-Consul-Index", "7")
		switch {
		case r.URL.Path == "/v1/catalog/nodes":
			_, _ = io.WriteString(w, `[{"Node":"k8s-c1","Address":"127.0.0.1","Meta":{"external-source":"kubernetes","k8s-cluster":"c1"},"CreateIndex":5,"ModifyIndex":5}]`)
		case strings.HasPrefix(r.URL.Path, "/v1/catalog/node-services/"):
			_, _ = io.WriteString(w, `{"Node":{"Node":"k8s-c1"},"Services":[]}`)
		case strings.HasPrefix(r.URL.Path, "/v1/health/"):
			_, _ = io.WriteString(w, `[]`)
		case r.URL.Path == "/v1/txn":
			_, _ = io.WriteString(w, `{"Results":[],"Errors":null}`)
		default:
			http.Error(w, "unexpected "+r.URL.Path, http.StatusNotFound)
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *shapeServer) take() []shapeReq {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.reqs
	s.reqs = nil
	return r
}

func (s *shapeServer) api(t *testing.T, dc string) *api.Client {
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = strings.TrimPrefix(s.srv.URL, "http://")
	cfg.Datacenter = dc
	ts, _ := conn.NewTokenSource("", "", nil)
	c, err := conn.NewAPIClient(cfg, ts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// compactJSON re-indents nothing: it makes a body comparable.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("body %q: %v", s, err)
	}
	return b.String()
}

func queries(reqs []shapeReq) []string {
	out := make([]string, 0, len(reqs))
	for _, r := range reqs {
		out = append(out, r.String())
	}
	sort.Strings(out)
	return out
}

// TestScopeRequestShapes: with a namespace and a partition, every read and
// every op of a transaction names them, and every request the datacenter;
// with mirroring, each instance's op names its Kubernetes namespace's
// mirror and reads ask for every namespace; the zero scope sends neither.
func TestScopeRequestShapes(t *testing.T) {
	o := testOwner{id: "c1"}
	in := o.instance(1, "web")
	in.Meta["k8s-namespace"] = "shop"
	old := Registered{Instance: o.instance(2, "web"), Node: "k8s-c1", Namespace: "team-a", ServiceIndex: 11, CheckIndex: 12, HasCheck: true}
	old.Meta["k8s-namespace"] = "shop"
	cases := []struct {
		name  string
		scope Scope
		oldNS string // the namespace Consul gave the entry deregistered
		// want: the reads' queries, sorted, then the txn's query and body.
		reads    []string
		txnQuery string
		txn      string
	}{{
		name:  "namespace and partition",
		scope: Scope{Namespace: "team-a", Partition: "part-1"},
		oldNS: "team-a",
		reads: []string{
			"GET /v1/catalog/node-services/k8s-c1?dc=dc2&filter=ID+%3D%3D+%22%22+and+ID+%21%3D+%22%22&ns=team-a&partition=part-1",
			"GET /v1/catalog/node-services/k8s-c1?dc=dc2&ns=team-a&partition=part-1",
			"GET /v1/catalog/nodes?dc=dc2&filter=Node+%3D%3D+%22k8s-c1%22+or+Node+matches+%22%5Ek8s-c1%5C%5C.%5B0-9%5D%2B%24%22&partition=part-1",
			"GET /v1/catalog/nodes?dc=dc2&node-meta=external-source%3Akubernetes&node-meta=k8s-cluster%3Ac1&partition=part-1",
			"GET /v1/catalog/nodes?dc=dc2&node-meta=external-source%3Akubernetes&partition=part-1",
			"GET /v1/health/service/web?dc=dc2&node-meta=external-source%3Akubernetes&node-meta=k8s-cluster%3Ac1&ns=team-a&partition=part-1",
		},
		txnQuery: "dc=dc2&partition=part-1",
		txn: `[{"KV":null,"Node":{"Verb":"cas","Node":{"ID":"","Node":"k8s-c1","Address":"127.0.0.1","Datacenter":"","TaggedAddresses":null,"Meta":{"external-source":"kubernetes","k8s-cluster":"c1"},"CreateIndex":0,"ModifyIndex":5,"Partition":"part-1"}},"Service":null,"Check":null},` +
			`{"KV":null,"Node":null,"Service":{"Verb":"cas","Node":"k8s-c1","Service":{"ID":"c1-web-1","Service":"web","Tags":["k8s","c1"],"Meta":{"external-source":"kubernetes","k8s-cluster":"c1","k8s-namespace":"shop"},"Port":80,"Address":"10.0.0.2","Weights":{"Passing":0,"Warning":0},"EnableTagOverride":false,"Namespace":"team-a","Partition":"part-1"}},"Check":null},` +
			`{"KV":null,"Node":null,"Service":null,"Check":{"Verb":"cas","Check":{"Node":"k8s-c1","CheckID":"kubernetes-readiness:c1-web-1","Name":"kubernetes-readiness","Status":"passing","Notes":"","Output":"ready","ServiceID":"c1-web-1","ServiceName":"web","ServiceTags":null,"Type":"kubernetes","Namespace":"team-a","Partition":"part-1","ExposedPort":0,"Definition":{"Interval":"0s","Timeout":"0s","DeregisterCriticalServiceAfter":"0s","HTTP":"","Header":null,"Method":"","Body":"","TLSServerName":"","TLSSkipVerify":false,"TCP":"","TCPUseTLS":false,"UDP":"","GRPC":"","OSService":"","GRPCUseTLS":false},"CreateIndex":0,"ModifyIndex":0}}},` +
			`{"KV":null,"Node":null,"Service":{"Verb":"delete-cas","Node":"k8s-c1","Service":{"ID":"c1-web-2","Service":"web","Tags":null,"Meta":null,"Port":0,"Address":"","Weights":{"Passing":0,"Warning":0},"EnableTagOverride":false,"ModifyIndex":11,"Namespace":"team-a","Partition":"part-1"}},"Check":null}]`,
	}, {
		name:  "mirroring",
		scope: Scope{MirrorNamespaces: true, MirrorPrefix: "k8s-"},
		oldNS: "team-a",
		reads: []string{
			"GET /v1/catalog/node-services/k8s-c1?dc=dc2&filter=ID+%3D%3D+%22%22+and+ID+%21%3D+%22%22&ns=%2A",
			"GET /v1/catalog/node-services/k8s-c1?dc=dc2&ns=%2A",
			"GET /v1/catalog/nodes?dc=dc2&filter=Node+%3D%3D+%22k8s-c1%22+or+Node+matches+%22%5Ek8s-c1%5C%5C.%5B0-9%5D%2B%24%22",
			"GET /v1/catalog/nodes?dc=dc2&node-meta=external-source%3Akubernetes",
			"GET /v1/catalog/nodes?dc=dc2&node-meta=external-source%3Akubernetes&node-meta=k8s-cluster%3Ac1",
			"GET /v1/health/service/web?dc=dc2&node-meta=external-source%3Akubernetes&node-meta=k8s-cluster%3Ac1&ns=%2A",
		},
		txnQuery: "dc=dc2",
		txn: `[{"KV":null,"Node":{"Verb":"cas","Node":{"ID":"","Node":"k8s-c1","Address":"127.0.0.1","Datacenter":"","TaggedAddresses":null,"Meta":{"external-source":"kubernetes","k8s-cluster":"c1"},"CreateIndex":0,"ModifyIndex":5}},"Service":null,"Check":null},` +
			`{"KV":null,"Node":null,"Service":{"Verb":"cas","Node":"k8s-c1","Service":{"ID":"c1-web-1","Service":"web","Tags":["k8s","c1"],"Meta":{"external-source":"kubernetes","k8s-cluster":"c1","k8s-namespace":"shop"},"Port":80,"Address":"10.0.0.2","Weights":{"Passing":0,"Warning":0},"EnableTagOverride":false,"Namespace":"k8s-shop"}},"Check":null},` +
			`{"KV":null,"Node":null,"Service":null,"Check":{"Verb":"cas","Check":{"Node":"k8s-c1","CheckID":"kubernetes-readiness:c1-web-1","Name":"kubernetes-readiness","Status":"passing","Notes":"","Output":"ready","ServiceID":"c1-web-1","ServiceName":"web","ServiceTags":null,"Type":"kubernetes","Namespace":"k8s-shop","ExposedPort":0,"Definition":{"Interval":"0s","Timeout":"0s","DeregisterCriticalServiceAfter":"0s","HTTP":"","Header":null,"Method":"","Body":"","TLSServerName":"","TLSSkipVerify":false,"TCP":"","TCPUseTLS":false,"UDP":"","GRPC":"","OSService":"","GRPCUseTLS":false},"CreateIndex":0,"ModifyIndex":0}}},` +
			`{"KV":null,"Node":null,"Service":{"Verb":"delete-cas","Node":"k8s-c1","Service":{"ID":"c1-web-2","Service":"web","Tags":null,"Meta":null,"Port":0,"Address":"","Weights":{"Passing":0,"Warning":0},"EnableTagOverride":false,"ModifyIndex":11,"Namespace":"team-a"}},"Check":null}]`,
	}, {
		name:  "none (Consul OSS); default is none",
		scope: Scope{Namespace: "default", Partition: "default"},
		reads: []string{
			"GET /v1/catalog/node-services/k8s-c1?dc=dc2",
			"GET /v1/catalog/node-services/k8s-c1?dc=dc2&filter=ID+%3D%3D+%22%22+and+ID+%21%3D+%22%22",
			"GET /v1/catalog/nodes?dc=dc2&filter=Node+%3D%3D+%22k8s-c1%22+or+Node+matches+%22%5Ek8s-c1%5C%5C.%5B0-9%5D%2B%24%22",
			"GET /v1/catalog/nodes?dc=dc2&node-meta=external-source%3Akubernetes",
			"GET /v1/catalog/nodes?dc=dc2&node-meta=external-source%3Akubernetes&node-meta=k8s-cluster%3Ac1",
			"GET /v1/health/service/web?dc=dc2&node-meta=external-source%3Akubernetes&node-meta=k8s-cluster%3Ac1",
		},
		txnQuery: "dc=dc2",
		txn: `[{"KV":null,"Node":{"Verb":"cas","Node":{"ID":"","Node":"k8s-c1","Address":"127.0.0.1","Datacenter":"","TaggedAddresses":null,"Meta":{"external-source":"kubernetes","k8s-cluster":"c1"},"CreateIndex":0,"ModifyIndex":5}},"Service":null,"Check":null},` +
			`{"KV":null,"Node":null,"Service":{"Verb":"cas","Node":"k8s-c1","Service":{"ID":"c1-web-1","Service":"web","Tags":["k8s","c1"],"Meta":{"external-source":"kubernetes","k8s-cluster":"c1","k8s-namespace":"shop"},"Port":80,"Address":"10.0.0.2","Weights":{"Passing":0,"Warning":0},"EnableTagOverride":false}},"Check":null},` +
			`{"KV":null,"Node":null,"Service":null,"Check":{"Verb":"cas","Check":{"Node":"k8s-c1","CheckID":"kubernetes-readiness:c1-web-1","Name":"kubernetes-readiness","Status":"passing","Notes":"","Output":"ready","ServiceID":"c1-web-1","ServiceName":"web","ServiceTags":null,"Type":"kubernetes","ExposedPort":0,"Definition":{"Interval":"0s","Timeout":"0s","DeregisterCriticalServiceAfter":"0s","HTTP":"","Header":null,"Method":"","Body":"","TLSServerName":"","TLSSkipVerify":false,"TCP":"","TCPUseTLS":false,"UDP":"","GRPC":"","OSService":"","GRPCUseTLS":false},"CreateIndex":0,"ModifyIndex":0}}},` +
			`{"KV":null,"Node":null,"Service":{"Verb":"delete-cas","Node":"k8s-c1","Service":{"ID":"c1-web-2","Service":"web","Tags":null,"Meta":null,"Port":0,"Address":"","Weights":{"Passing":0,"Warning":0},"EnableTagOverride":false,"ModifyIndex":11}},"Check":null}]`,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newShapeServer(t)
			c := NewClient(s.api(t, "dc2"), o, Options{Scope: tc.scope})
			ctx := t.Context()
			_, err1 := c.ReadNodes(ctx)
			_, err2 := c.ReadNode(ctx)
			_, _, err3 := c.ReadService(ctx, "web")
			_, err4 := c.NodeIndex(ctx, "k8s-c1")
			_, err5 := c.ClusterIDs(ctx)
			if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
				t.Fatal(err)
			}
			reads := queries(s.take())
			// ReadNode lists the nodes, then reads each one's services
			// (and, had it any, their checks): the distinct shapes.
			reads = distinct(reads)
			if got, want := strings.Join(reads, "\n"), strings.Join(distinct(tc.reads), "\n"); got != want {
				t.Errorf("reads:\n%s\nwant:\n%s", got, want)
			}
			gone := old
			gone.Namespace = tc.oldNS
			if _, err := c.Apply(ctx, Change{Register: []Instance{in}, Deregister: []Registered{gone}}); err != nil {
				t.Fatal(err)
			}
			var txns []shapeReq
			for _, r := range s.take() {
				if r.path == "/v1/txn" {
					txns = append(txns, r)
				}
			}
			if len(txns) != 1 {
				t.Fatalf("%d transactions, want 1", len(txns))
			}
			if txns[0].query != tc.txnQuery {
				t.Errorf("txn query %q, want %q", txns[0].query, tc.txnQuery)
			}
			if got, want := compactJSON(t, txns[0].body), compactJSON(t, tc.txn); got != want {
				t.Errorf("txn body:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func distinct(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// TestScopeMetaKey: the meta key mirroring reads is the one instances carry
// (worker.MetaNamespace; this package cannot import worker).
func TestScopeMetaKey(t *testing.T) {
	if metaK8sNamespace != "k8s-namespace" {
		t.Fatalf("metaK8sNamespace = %q", metaK8sNamespace)
	}
	s := Scope{MirrorNamespaces: true, MirrorPrefix: "k8s-"}
	if got := s.NamespaceOf(Instance{Meta: map[string]string{"k8s-namespace": "shop"}}); got != "k8s-shop" {
		t.Fatalf("mirror of shop: %q", got)
	}
	if got := (Scope{Namespace: "default"}).NamespaceOf(Instance{}); got != "" {
		t.Fatalf("default namespace sent as %q", got)
	}
}

// TestCheckScopeOnOSS: against the real Consul OSS agent a namespace, a
// partition or mirroring is refused at once with conn.ErrEnterpriseOnly naming
// the flag; the zero scope sends nothing and passes.
func TestCheckScopeOnOSS(t *testing.T) {
	if agent == nil {
		t.Skip("needs a real Consul agent")
	}
	for _, tc := range []struct {
		scope Scope
		flag  string
	}{
		{Scope{Namespace: "team-a"}, "--consul-namespace=team-a"},
		{Scope{Partition: "part-1"}, "--consul-partition=part-1"},
		{Scope{MirrorNamespaces: true}, "--enable-k8s-namespace-mirroring"},
	} {
		c := NewClient(agent.Client, testOwner{id: "scope"}, Options{Scope: tc.scope})
		err := c.CheckScope(t.Context())
		if !errors.Is(err, conn.ErrEnterpriseOnly) || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%+v: err %v, want conn.ErrEnterpriseOnly naming %s", tc.scope, err, tc.flag)
		}
	}
	if err := NewClient(agent.Client, testOwner{id: "scope"}, Options{Scope: Scope{Namespace: "default"}}).CheckScope(t.Context()); err != nil {
		t.Errorf("default namespace: %v", err)
	}
}
