package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/consul/api"
)

// trickyStrings are what a JSON string encoder can get wrong: HTML's
// escapes, control bytes, invalid UTF-8, U+2028/U+2029, multi-byte runes.
var trickyStrings = []string{"", "a", "web-1.ns.svc", `"quoted" \back\`, "<script>&amp;", "\u2028\u2029", "\x00\x01\x1f\x7f",
	"\b\f\n\r\t", "\xff\xfe", "caf\xc3", "é中🙂", "a\u2028b\xffc<d>", "k8s-cluster", "service:x"}

func randString(r *rand.Rand) string {
	if r.IntN(3) == 0 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return string(b)
	}
	return trickyStrings[r.IntN(len(trickyStrings))]
}

func randStrings(r *rand.Rand) []string {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []string{}
	}
	out := make([]string, 1+r.IntN(4))
	for i := range out {
		out[i] = randString(r)
	}
	return out
}

func randMeta(r *rand.Rand) map[string]string {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return map[string]string{}
	}
	m := map[string]string{}
	for range 1 + r.IntN(20) { // past appendStringMap's 16 on-stack keys too
		m[randString(r)+fmt.Sprint(r.IntN(100))] = randString(r)
	}
	return m
}

// randOp is an op as serviceOp, checkOp and the deletes build them, or
// (one in five) one with a field the encoder leaves to json.Marshal.
func randOp(r *rand.Rand) *api.TxnOp {
	idx := func() uint64 { return []uint64{0, 1, 42, 1 << 63}[r.IntN(4)] }
	ns := func() string { return []string{"", "", "team-a"}[r.IntN(3)] }
	if r.IntN(2) == 0 {
		s := api.AgentService{ID: randString(r), Service: randString(r), Tags: randStrings(r), Meta: randMeta(r),
			Port: r.IntN(70000) - 1, Address: randString(r), ModifyIndex: idx(), Namespace: ns(), Partition: ns()}
		if r.IntN(2) == 0 {
			s.Weights = api.AgentWeights{Passing: r.IntN(100), Warning: 1}
		}
		op := &api.TxnOp{Service: &api.ServiceTxnOp{Verb: []api.ServiceOp{api.ServiceCAS, api.ServiceDeleteCAS, api.ServiceSet}[r.IntN(3)],
			Node: randString(r), Service: s}}
		switch r.IntN(10) {
		case 0:
			op.Service.Service.TaggedAddresses = map[string]api.ServiceAddress{"lan": {Address: "10.0.0.1", Port: 80}}
		case 1:
			op.Service.Service.EnableTagOverride = true
		case 2:
			op.Node = &api.NodeTxnOp{Verb: api.NodeCAS, Node: api.Node{Node: "n"}}
		}
		return op
	}
	c := api.HealthCheck{Node: randString(r), CheckID: randString(r), Name: randString(r), Status: randString(r),
		Notes: randString(r), Output: randString(r), ServiceID: randString(r), ServiceName: randString(r),
		ServiceTags: randStrings(r), Type: randString(r), Namespace: ns(), Partition: ns(), ExposedPort: r.IntN(3),
		CreateIndex: idx(), ModifyIndex: idx()}
	op := &api.TxnOp{Check: &api.CheckTxnOp{Verb: []api.CheckOp{api.CheckCAS, api.CheckDeleteCAS}[r.IntN(2)], Check: c}}
	switch r.IntN(10) {
	case 0:
		op.Check.Check.Definition.HTTP = "http://x"
	case 1:
		op.Check.Check.PeerName = "peer"
	case 2:
		op.Service = &api.ServiceTxnOp{Verb: api.ServiceSet}
	}
	return op
}

// TestAppendOpIsJSONMarshal: AppendOp writes exactly json.Marshal's bytes,
// for the ops fleetsync builds and for the ones it leaves to json.Marshal.
func TestAppendOpIsJSONMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		op := randOp(r)
		want, err := json.Marshal(op)
		if err != nil {
			t.Fatal(err)
		}
		prefix := []byte("[x,")
		got, err := AppendOp(bytes.Clone(prefix), op)
		if err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		if !bytes.Equal(got[len(prefix):], want) || !bytes.Equal(got[:len(prefix)], prefix) {
			t.Fatalf("op %d:\nappendOp:     %s\njson.Marshal: %s", i, got, want)
		}
	}
}

func FuzzAppendOp(f *testing.F) {
	for i, s := range trickyStrings {
		f.Add(s, trickyStrings[(i+1)%len(trickyStrings)], i*1000, uint64(i))
	}
	f.Fuzz(func(t *testing.T, a, b string, port int, index uint64) {
		for _, op := range []*api.TxnOp{
			{Service: &api.ServiceTxnOp{Verb: api.ServiceCAS, Node: b, Service: api.AgentService{ID: a, Service: b, Address: a,
				Port: port, Tags: []string{a, b}, Meta: map[string]string{a: b, b: a}, ModifyIndex: index, Namespace: b}}},
			{Check: &api.CheckTxnOp{Verb: api.CheckCAS, Check: api.HealthCheck{Node: a, CheckID: b, Status: a, Output: b,
				ServiceTags: []string{b}, ExposedPort: port, ModifyIndex: index, Partition: a}}},
		} {
			want, err := json.Marshal(op)
			if err != nil {
				t.Fatal(err)
			}
			got, err := AppendOp(nil, op)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("AppendOp: %s (%v)\njson.Marshal: %s", got, err, want)
			}
		}
	})
}

func BenchmarkAppendOp(b *testing.B) {
	svc := api.AgentService{ID: "k8s-c1/shop/web/10.0.0.1:8080", Service: "web", Address: "10.0.0.1", Port: 8080, Tags: []string{"k8s"},
		Meta: map[string]string{"k8s-cluster": "c1", "k8s-namespace": "shop", "k8s-service-name": "web", "external-source": "kubernetes", "port-http": "8080"}}
	ops := instanceOps("k8s-c1-3", []api.AgentService{svc}, map[string]api.HealthCheck{svc.ID: {Status: "passing", Output: "Kubernetes endpoint is ready"}})[1:]
	ops[0].Service.Verb, ops[1].Check.Verb = api.ServiceCAS, api.CheckCAS
	b.Run("AppendOp", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = buf[:0]
			for _, op := range ops {
				buf, _ = AppendOp(buf, op)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, op := range ops {
				_, _ = json.Marshal(op)
			}
		}
	})
}
