package wire

import gojson "github.com/goccy/go-json"

// decode decodes a 200 answer into out with github.com/goccy/go-json: the
// values encoding/json gives, or an error where it gives one
// (TestDecodesAsEncodingJSON, TestDecodeMutations, FuzzDecode), in less
// CPU on Consul's answers; docs/design/decisions/codec.md has the figures.
func decode(b []byte, out any) error { return gojson.Unmarshal(b, out) }

// Decode decodes an answer as the reads do (decode), for the codec
// benchmarks (codecbench).
func Decode(b []byte, out any) error { return decode(b, out) }
