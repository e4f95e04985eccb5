package wire

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// The lean answers, each as a fresh out.
var leanKinds = []struct {
	name string
	out  func() any
}{
	{"node-services", func() any { return new(*NodeServices) }},
	{"node-services-struct", func() any { return &NodeServices{} }},
	{"checks", func() any { return new([]*Check) }},
	{"entries", func() any { return new([]*Entry) }},
	{"txn", func() any { return &TxnResponse{} }},
}

// agree checks decode against encoding/json for doc decoded into a fresh
// out: an error where encoding/json gives one, else the same value.
func agree(t testing.TB, doc []byte, out func() any) {
	t.Helper()
	want := out()
	wantErr := json.Unmarshal(doc, want)
	got := out()
	err := decode(doc, got)
	if (err != nil) != (wantErr != nil) || (err == nil && !reflect.DeepEqual(got, want)) {
		t.Fatalf("%q: decode gave %s (%v), encoding/json %s (%v)", doc, dump(got), err, dump(want), wantErr)
	}
}

// dump shows a decoded value with its pointers followed.
func dump(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

// consulAnswers are answers shaped as Consul writes them: every field of
// consul/api's types (Proxy, Connect, TaggedAddresses, a check's
// Definition and the service's tags), most of which the lean types skip.
func consulAnswers(t testing.TB) map[string][]byte {
	t.Helper()
	svc := func(i int) *api.AgentService {
		return &api.AgentService{
			ID: fmt.Sprintf("k8s-a-default-web-10.0.0.%d-80", i), Service: "web", Tags: []string{"k8s-a", "blue"},
			Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "a", "k8s-pod": fmt.Sprintf("web-%d", i)},
			Port: 80, Address: fmt.Sprintf("10.0.0.%d", i), Weights: api.AgentWeights{Passing: 1, Warning: 1},
			TaggedAddresses: map[string]api.ServiceAddress{"lan_ipv4": {Address: "10.0.0.1", Port: 80}, "wan_ipv4": {Address: "10.0.0.1", Port: 80}},
			Proxy:           &api.AgentServiceConnectProxyConfig{Mode: api.ProxyModeDefault, MeshGateway: api.MeshGatewayConfig{}, Expose: api.ExposeConfig{}},
			Connect:         &api.AgentServiceConnect{}, CreateIndex: uint64(10 + i), ModifyIndex: uint64(20 + i), Namespace: "",
		}
	}
	chk := func(i int) *api.HealthCheck {
		return &api.HealthCheck{
			Node: "k8s-a", CheckID: checkID(svc(i).ID), Name: "Kubernetes readiness", Status: api.HealthPassing, Output: "Kubernetes: ready",
			ServiceID: svc(i).ID, ServiceName: "web", ServiceTags: []string{"k8s-a", "blue"}, Type: "ttl",
			Definition: api.HealthCheckDefinition{HTTP: "", Interval: 0}, CreateIndex: uint64(30 + i), ModifyIndex: uint64(40 + i),
		}
	}
	marshal := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var svcs []*api.AgentService
	var checks api.HealthChecks
	var entries []*api.ServiceEntry
	for i := range 3 {
		svcs = append(svcs, svc(i))
		checks = append(checks, chk(i))
		entries = append(entries, &api.ServiceEntry{
			Node:    &api.Node{Node: "k8s-a", Address: "127.0.0.1", Meta: map[string]string{"k8s-cluster": "a"}, TaggedAddresses: map[string]string{"lan": "127.0.0.1"}},
			Service: svc(i), Checks: api.HealthChecks{chk(i), {Node: "k8s-a", CheckID: "serfHealth", Status: "passing"}},
		})
	}
	txn := &api.TxnResponse{Results: api.TxnResults{
		{Node: &api.Node{Node: "k8s-a", Address: "127.0.0.1", Meta: map[string]string{"k8s-cluster": "a"}, CreateIndex: 5, ModifyIndex: 7}},
		{Service: svc(1)}, {Check: chk(1)},
	}}
	return map[string][]byte{
		"node-services": marshal(&api.CatalogNodeServiceList{Node: &api.Node{Node: "k8s-a", Address: "127.0.0.1"}, Services: svcs}),
		"checks":        marshal(checks),
		"entries":       marshal(entries),
		"txn":           marshal(txn),
	}
}

// TestDecodesAsEncodingJSON: Consul's answers, indented or not, and odd
// documents (escapes, invalid UTF-8, nulls, duplicate and folded keys,
// numbers out of range, invalid JSON, trailing bytes) decode as
// encoding/json decodes them.
func TestDecodesAsEncodingJSON(t *testing.T) {
	real := consulAnswers(t)
	for _, k := range leanKinds {
		doc := real[strings.TrimSuffix(k.name, "-struct")]
		agree(t, doc, k.out)
		pretty, err := json.MarshalIndent(json.RawMessage(doc), "", "    ") // as Consul writes it
		if err != nil {
			t.Fatal(err)
		}
		agree(t, pretty, k.out)
	}
	svc := func(fields string) string { return `{"Services":[{` + fields + `}]}` }
	cases := []struct{ kind, doc string }{
		{"node-services", svc(`"ID":"a\"b\\c\/d\n\u00e9\ud83d\ude00","Service":"x"`)},
		{"node-services", svc(`"ID":"lone \ud800 surrogate"`)},
		{"node-services", svc("\"ID\":\"raw \xc3\xa9 and invalid \xff\xfe\"")},
		{"node-services", svc(`"Tags":["a","b\u0000"],"Meta":{"k\u00e9y":"v","k":"1","k":"2"}`)},
		{"node-services", svc(`"ID":null,"Port":null,"Tags":null,"Meta":null,"Weights":null,"ModifyIndex":null`)},
		{"node-services", svc(`"Tags":[],"Meta":{},"Weights":{}`)},
		{"node-services", svc(`"Port":-0,"Weights":{"Passing":-3,"Warning":0},"ModifyIndex":18446744073709551615`)},
		{"node-services", `{"Services":null}`},
		{"node-services", `{"Services":[]}`},
		{"node-services", `{"Services":[null,{}]}`},
		{"node-services", `{}`},
		{"node-services", svc(`"Proxy":{"a":[1,2.5e-3,true,false,null,{"b":[[[]]]}]},"X":"\u0041"`)},
		{"node-services", " \t\r\n" + svc(` "ID" : "a" , "Port" : 1 `) + " \n"},
		{"node-services", `null`},
		{"node-services", svc(`"id":"folded"`)},
		{"node-services", svc(`"ID":"a","ID":"b"`)},
		{"node-services", svc(`"I\u0044":"escaped key"`)},
		{"node-services", svc(`"Port":1.5`)},
		{"node-services", svc(`"Port":1e2`)},
		{"node-services", svc(`"Port":"80"`)},
		{"node-services", svc(`"Port":99999999999999999999`)},
		{"node-services", svc(`"ModifyIndex":-1`)},
		{"node-services", svc(`"ModifyIndex":18446744073709551616`)},
		{"node-services", svc(`"Tags":[null]`)},
		{"node-services", svc(`"Tags":"a"`)},
		{"node-services", svc(`"Meta":{"k":null}`)},
		{"node-services", svc(`"Meta":{"k":1}`)},
		{"node-services", svc(`"Weights":{"passing":1}`)},
		{"node-services", svc(`"Proxy":{"a":01}`)},
		{"node-services", svc(`"Proxy":{"a":tru}`)},
		{"node-services", svc(`"Proxy":"bad \x01 control"`)},
		{"node-services", svc(`"Proxy":"bad \x escape"`)},
		{"node-services", svc(`"Proxy":[1,]`)},
		{"node-services", svc(`"Proxy":` + strings.Repeat("[", 100) + strings.Repeat("]", 100))},
		{"node-services", svc(`"ID":"a"`) + `x`},
		{"node-services", svc(`"ID":"a"`) + "\x00"},
		{"node-services", svc(`"ID":"a"`) + " \x00" + svc(`"ID":"b"`)},
		{"checks", "[]\x00"},
		{"node-services", svc(`"ID":"a"`)[:20]},
		{"checks", `[]`},
		{"checks", `[null,{"CheckID":"c","ServiceID":"s","Status":"critical","Output":"\tx","Namespace":"ns","ModifyIndex":3,"Definition":{}}]`},
		{"checks", `[{"serviceid":"s"}]`},
		{"checks", `{}`},
		{"entries", `[{"Node":null,"Service":null,"Checks":null}]`},
		{"entries", `[{"Node":{"Node":"n","Address":"x"},"Checks":[]}]`},
		{"entries", `[{"Node":{"Node":"n","node":"m"}}]`},
		{"txn", `{"Results":null,"Errors":null}`},
		{"txn", `{"Results":[null,{"Node":null},{"KV":{"Key":"k"}},{"Service":{"ID":"s","ModifyIndex":4,"Tags":["x"]}}]}`},
		{"txn", `{"Results":[{"Check":{"CheckID":"c","ModifyIndex":5}}],"Errors":[{"OpIndex":0,"What":"no"}]}`},
		{"txn", `null`},
	}
	kinds := map[string]func() any{}
	for _, k := range leanKinds {
		kinds[k.name] = k.out
	}
	for _, tc := range cases {
		agree(t, []byte(tc.doc), kinds[tc.kind])
	}
}

// TestDecodeMutations: thousands of documents a byte or a few away
// from Consul's answers (truncated, spliced, with JSON's special
// characters put in) each decode as encoding/json decodes them.
func TestDecodeMutations(t *testing.T) {
	real := consulAnswers(t)
	rnd := rand.New(rand.NewPCG(17, 4))
	special := []byte("\"\\{}[],:0123456789-+.eEtrufalsn u\x00\x1f\x7f\x80\xc3\xff")
	n := 4000
	if testing.Short() {
		n = 500
	}
	for _, k := range leanKinds {
		base := real[strings.TrimSuffix(k.name, "-struct")]
		for range n {
			doc := append([]byte(nil), base...)
			for range 1 + rnd.IntN(3) {
				if len(doc) == 0 {
					break
				}
				i := rnd.IntN(len(doc))
				switch rnd.IntN(4) {
				case 0:
					doc = append(doc[:i], doc[i+1:]...)
				case 1:
					doc = append(doc[:i], append([]byte{special[rnd.IntN(len(special))]}, doc[i:]...)...)
				case 2:
					doc[i] = special[rnd.IntN(len(special))]
				case 3:
					doc = doc[:i]
				}
				if rnd.IntN(8) == 0 { // something after the document
					doc = append(doc, special[rnd.IntN(len(special))])
				}
			}
			agree(t, doc, k.out)
		}
	}
}

// FuzzDecode: go test -fuzz FuzzDecode ./consul/internal/wire (the seeds
// run in every go test).
func FuzzDecode(f *testing.F) {
	for _, doc := range consulAnswers(f) {
		f.Add(doc)
	}
	f.Add([]byte(`{"Services":[{"ID":"\ud800","Meta":{"a":"b","a":"c"}}]}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		for _, k := range leanKinds {
			agree(t, doc, k.out)
		}
	})
}

// TestDecodesConsulsAnswers: on a real agent, the answers of the reads of
// owned state and of a transaction, with tags, meta and check output that
// need escapes and hold non-ASCII text, decode as encoding/json decodes
// them.
func TestDecodesConsulsAnswers(t *testing.T) {
	a := needConsul(t)
	node := "k8s-scan"
	in := []api.AgentService{instance(1, "web"), instance(2, "web")}
	in[0].Tags = append(in[0].Tags, `quote"back\slash`, "tab\there", "caf\u00e9 \U0001F600")
	in[0].Meta["k8s-pod"] = "<pod>&\u2028"
	critical := map[string]api.HealthCheck{in[1].ID: {Status: api.HealthCritical, Output: "line one\nline two \u00fc"}}
	commitTxn(t, a, instanceOps(node, in, critical))
	answers := map[string]func() any{
		"/v1/catalog/node-services/" + node: func() any { return new(*NodeServices) },
		"/v1/health/node/" + node:           func() any { return new([]*Check) },
		"/v1/health/service/web":            func() any { return new([]*Entry) },
	}
	for path, out := range answers {
		body := get(t, a, path)
		agree(t, body, out)
	}
	// A transaction's answer, as the daemon's raw client reads it.
	txn := commitTxn(t, a, instanceOps(node, in[1:], critical)[1:])
	agree(t, txn, func() any { return &TxnResponse{} })
}

// BenchmarkDecode decodes Consul's own answers (a real agent's, 1,000
// instances on one node: what a restart reads per node, and one Service's
// transaction of 10) into consul/api's types, into the lean ones with
// encoding/json, and into the lean ones as the daemon does (decode).
func BenchmarkDecode(b *testing.B) {
	a := needConsul(b)
	node := "k8s-decode"
	var all []api.AgentService
	for i := range 1000 {
		all = append(all, instance(i, fmt.Sprintf("svc-%d", i/10)))
	}
	for i := 0; i < len(all); i += 50 { // 101 ops: within Consul's 128 per transaction
		commitTxn(b, a, instanceOps(node, all[i:i+50], nil))
	}
	services, checks := get(b, a, "/v1/catalog/node-services/"+node), get(b, a, "/v1/health/node/"+node)
	// The answer of one Service's transaction: its node op and 10 service
	// and check ops, rewritten as they are.
	txn := commitTxn(b, a, instanceOps(node, all[:10], nil))
	cases := []struct {
		name string
		body []byte
		full func() any
		lean func() any
	}{
		{"node-services-1000", services, func() any { return &api.CatalogNodeServiceList{} }, func() any { return &NodeServices{} }},
		{"health-node-1000", checks, func() any { return &api.HealthChecks{} }, func() any { return new([]*Check) }},
		{"txn-answer-10", txn, func() any { return &api.TxnResponse{} }, func() any { return &TxnResponse{} }},
	}
	for _, tc := range cases {
		for _, kind := range []string{"api", "lean", "wire"} {
			b.Run(tc.name+"/"+kind, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(tc.body)))
				for b.Loop() {
					var err error
					switch kind {
					case "api":
						err = json.Unmarshal(tc.body, tc.full())
					case "lean":
						err = json.Unmarshal(tc.body, tc.lean())
					case "wire":
						err = decode(tc.body, tc.lean())
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
