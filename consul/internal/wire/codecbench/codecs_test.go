package codecbench

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/bytedance/sonic"
	jsonv2 "github.com/go-json-experiment/json"
	jsonv1 "github.com/go-json-experiment/json/v1"
	gojson "github.com/goccy/go-json"
	"github.com/hashicorp/consul/api"
	"github.com/mailru/easyjson"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
	"github.com/fleetsync/fleetsync/consul/internal/wire/wiretest"
)

// decoders are the candidates, each decoding a body into a fresh lean value.
var decoders = []struct {
	name   string
	decode func(b []byte, out any) error
}{
	{"encoding-json", json.Unmarshal},
	{"wire", wire.Decode},
	{"goccy", gojson.Unmarshal},
	{"jsonv2", func(b []byte, out any) error { return jsonv2.Unmarshal(b, out) }},
	{"jsonv2-v1opts", func(b []byte, out any) error { return jsonv2.Unmarshal(b, out, jsonv1.DefaultOptionsV1()) }},
	{"sonic-std", sonic.ConfigStd.Unmarshal},
	{"easyjson", func(b []byte, out any) error {
		switch o := out.(type) {
		case **wire.NodeServices:
			v := new(easyNodeServices)
			err := easyjson.Unmarshal(b, v)
			*o = (*wire.NodeServices)(v)
			return err
		case *[]*wire.Check:
			return easyjson.Unmarshal(b, (*easyChecks)(o))
		case *wire.TxnResponse:
			return easyjson.Unmarshal(b, (*easyTxnResponse)(o))
		}
		panic("no easyjson code for this type")
	}},
}

// encoders write a transaction's body (easyjson has none: it generates
// code only for its own package's types, and the ops are consul/api's).
var encoders = []struct {
	name   string
	encode func(ops api.TxnOps) ([]byte, error)
}{
	{"encoding-json", func(ops api.TxnOps) ([]byte, error) { return json.Marshal(ops) }},
	{"wire", func(ops api.TxnOps) ([]byte, error) {
		body := append(make([]byte, 0, 64<<10), '[')
		var err error
		for i, op := range ops {
			if i > 0 {
				body = append(body, ',')
			}
			if body, err = wire.AppendOp(body, op); err != nil {
				return nil, err
			}
		}
		return append(body, ']'), nil
	}},
	{"goccy", func(ops api.TxnOps) ([]byte, error) { return gojson.Marshal(ops) }},
	{"jsonv2", func(ops api.TxnOps) ([]byte, error) { return jsonv2.Marshal(ops) }},
	{"jsonv2-v1opts", func(ops api.TxnOps) ([]byte, error) { return jsonv2.Marshal(ops, jsonv1.DefaultOptionsV1()) }},
	{"sonic-std", func(ops api.TxnOps) ([]byte, error) { return sonic.ConfigStd.Marshal(ops) }},
}

type answer struct {
	name string
	body []byte
	out  func() any
}

func answers(tb testing.TB) []answer {
	return []answer{
		{"node-services-1000", wiretest.Read(tb, wiretest.NodeServices), func() any { return new(*wire.NodeServices) }},
		{"health-node-1000", wiretest.Read(tb, wiretest.NodeChecks), func() any { return new([]*wire.Check) }},
		{"txn-answer-128", wiretest.Read(tb, wiretest.TxnAnswer), func() any { return &wire.TxnResponse{} }},
	}
}

// TestCandidatesAgree: every candidate decodes Consul's answers to what
// encoding/json gives; the encoders that write what json.Marshal writes
// are listed (jsonv2 with its own defaults does not: nil slices as [],
// no HTML escaping).
func TestCandidatesAgree(t *testing.T) {
	for _, a := range answers(t) {
		want := a.out()
		if err := json.Unmarshal(a.body, want); err != nil {
			t.Fatal(err)
		}
		for _, d := range decoders {
			got := a.out()
			if err := d.decode(a.body, got); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s/%s: differs from encoding/json (%v)", a.name, d.name, err)
			}
		}
	}
	ops := wiretest.TxnOps(0, 42)
	want, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range encoders {
		got, err := e.encode(ops)
		t.Logf("encode/%s: the bytes of json.Marshal: %v (err %v)", e.name, bytes.Equal(got, want), err)
	}
}

// BenchmarkCodecs: decode of a node's 1,000 services and checks and of a
// 128-op transaction's answer into the lean types, and encode of that
// transaction, by each candidate.
func BenchmarkCodecs(b *testing.B) {
	for _, a := range answers(b) {
		for _, d := range decoders {
			b.Run("decode/"+a.name+"/"+d.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(a.body)))
				for b.Loop() {
					if err := d.decode(a.body, a.out()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	ops := wiretest.TxnOps(0, 42)
	for _, e := range encoders {
		b.Run("encode/txn-128/"+e.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.encode(ops); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
