package wire

import (
	gojson "github.com/goccy/go-json"
	"github.com/hashicorp/consul/api"
)

// AppendOp appends op's JSON to dst: byte for byte what json.Marshal(op)
// gives (TestAppendOpIsJSONMarshal, FuzzAppendOp; the body's size counts
// against Consul's transaction limit as consul/api's would), written by
// github.com/goccy/go-json, which encodes a cold start's ops in about 40 % of
// encoding/json's CPU (docs/design/decisions/codec.md).
func AppendOp(dst []byte, op *api.TxnOp) ([]byte, error) {
	b, err := gojson.Marshal(op)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}
