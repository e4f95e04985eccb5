// Package codecbench compares JSON codecs on Consul 1.14's own answers
// (wiretest): decoding a node's services and checks and a transaction's
// answer into the wire package's lean types, and encoding a 128-op
// transaction, with encoding/json, the wire package's codec,
// github.com/goccy/go-json, github.com/go-json-experiment/json,
// github.com/bytedance/sonic and github.com/mailru/easyjson (generated
// code, easy_easyjson.go). It is a module of its own so that the
// candidates stay out of fleetsync's go.mod:
//
//	cd consul/internal/wire/codecbench && go test -run '^$' -bench . -benchmem -count 5
//
// docs/design/decisions/codec.md records the figures and the choice.
package codecbench
