package wire

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"
)

// AppendOp appends op's JSON, byte for byte what json.Marshal(op) gives
// (TestAppendOpIsJSONMarshal, FuzzAppendOp), to dst.
//
// A cold start encodes three ops per instance; through encoding/json's
// reflection that was 11 % of the daemon's CPU while it wrote 10,000
// Services (and more again in the GC). The ops fleetsync writes most, a
// service or check op with the fields serviceOp and checkOp set, are
// written here field by field; any other op, or one with a field set
// that this encoder does not write, goes to json.Marshal.
func AppendOp(dst []byte, op *api.TxnOp) ([]byte, error) {
	if op.KV == nil && op.Node == nil {
		switch {
		case op.Service != nil && op.Check == nil && plainService(&op.Service.Service):
			dst = append(dst, `{"KV":null,"Node":null,"Service":{"Verb":`...)
			dst = appendJSONString(dst, string(op.Service.Verb))
			dst = append(dst, `,"Node":`...)
			dst = appendJSONString(dst, op.Service.Node)
			dst = append(dst, `,"Service":`...)
			dst = appendService(dst, &op.Service.Service)
			return append(dst, `},"Check":null}`...), nil
		case op.Check != nil && op.Service == nil && plainCheck(&op.Check.Check):
			dst = append(dst, `{"KV":null,"Node":null,"Service":null,"Check":{"Verb":`...)
			dst = appendJSONString(dst, string(op.Check.Verb))
			dst = append(dst, `,"Check":`...)
			dst = appendCheck(dst, &op.Check.Check)
			return append(dst, `}}`...), nil
		}
	}
	b, err := json.Marshal(op)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// plainService reports whether s sets only the fields appendService writes.
func plainService(s *api.AgentService) bool {
	rest := *s
	rest.ID, rest.Service, rest.Tags, rest.Meta, rest.Port, rest.Address = "", "", nil, nil, 0, ""
	rest.Weights, rest.EnableTagOverride, rest.ModifyIndex = api.AgentWeights{}, false, 0
	rest.Namespace, rest.Partition = "", ""
	return reflect.ValueOf(&rest).Elem().IsZero()
}

// plainCheck reports whether c sets only the fields appendCheck writes
// (its Definition is the zero one).
func plainCheck(c *api.HealthCheck) bool {
	rest := *c
	rest.Node, rest.CheckID, rest.Name, rest.Status, rest.Notes, rest.Output = "", "", "", "", "", ""
	rest.ServiceID, rest.ServiceName, rest.ServiceTags, rest.Type = "", "", nil, ""
	rest.Namespace, rest.Partition, rest.ExposedPort, rest.CreateIndex, rest.ModifyIndex = "", "", 0, 0, 0
	return reflect.ValueOf(&rest).Elem().IsZero()
}

// appendService writes the fields plainService allows, in the struct's
// order, with its omitempty rules.
func appendService(dst []byte, s *api.AgentService) []byte {
	dst = append(dst, `{"ID":`...)
	dst = appendJSONString(dst, s.ID)
	dst = append(dst, `,"Service":`...)
	dst = appendJSONString(dst, s.Service)
	dst = append(dst, `,"Tags":`...)
	dst = appendStrings(dst, s.Tags)
	dst = append(dst, `,"Meta":`...)
	dst = appendStringMap(dst, s.Meta)
	dst = append(dst, `,"Port":`...)
	dst = strconv.AppendInt(dst, int64(s.Port), 10)
	dst = append(dst, `,"Address":`...)
	dst = appendJSONString(dst, s.Address)
	dst = append(dst, `,"Weights":{"Passing":`...)
	dst = strconv.AppendInt(dst, int64(s.Weights.Passing), 10)
	dst = append(dst, `,"Warning":`...)
	dst = strconv.AppendInt(dst, int64(s.Weights.Warning), 10)
	dst = append(dst, `},"EnableTagOverride":`...)
	dst = strconv.AppendBool(dst, s.EnableTagOverride)
	if s.ModifyIndex != 0 {
		dst = append(dst, `,"ModifyIndex":`...)
		dst = strconv.AppendUint(dst, s.ModifyIndex, 10)
	}
	dst = appendScope(dst, s.Namespace, s.Partition)
	return append(dst, '}')
}

// zeroDefinition is the JSON of the zero HealthCheckDefinition as
// json.Marshal writes it inside an op: its MarshalJSON has a pointer
// receiver, used only where the check is addressable (behind the op's
// pointer), so the check is marshalled by pointer here too.
var zeroDefinition = func() []byte {
	b, err := json.Marshal(&api.HealthCheck{})
	if err != nil {
		panic(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		panic(err)
	}
	return slices.Clone(fields["Definition"])
}()

// appendCheck writes the fields plainCheck allows, in the struct's order,
// with its omitempty rules.
func appendCheck(dst []byte, c *api.HealthCheck) []byte {
	for _, f := range [...]struct {
		name, v string
	}{{`{"Node":`, c.Node}, {`,"CheckID":`, c.CheckID}, {`,"Name":`, c.Name}, {`,"Status":`, c.Status},
		{`,"Notes":`, c.Notes}, {`,"Output":`, c.Output}, {`,"ServiceID":`, c.ServiceID}, {`,"ServiceName":`, c.ServiceName}} {
		dst = append(dst, f.name...)
		dst = appendJSONString(dst, f.v)
	}
	dst = append(dst, `,"ServiceTags":`...)
	dst = appendStrings(dst, c.ServiceTags)
	dst = append(dst, `,"Type":`...)
	dst = appendJSONString(dst, c.Type)
	dst = appendScope(dst, c.Namespace, c.Partition)
	dst = append(dst, `,"ExposedPort":`...)
	dst = strconv.AppendInt(dst, int64(c.ExposedPort), 10)
	dst = append(dst, `,"Definition":`...)
	dst = append(dst, zeroDefinition...)
	dst = append(dst, `,"CreateIndex":`...)
	dst = strconv.AppendUint(dst, c.CreateIndex, 10)
	dst = append(dst, `,"ModifyIndex":`...)
	dst = strconv.AppendUint(dst, c.ModifyIndex, 10)
	return append(dst, '}')
}

// appendScope writes the omitempty Namespace and Partition fields that
// services and checks both end their Consul fields with.
func appendScope(dst []byte, namespace, partition string) []byte {
	if namespace != "" {
		dst = append(dst, `,"Namespace":`...)
		dst = appendJSONString(dst, namespace)
	}
	if partition != "" {
		dst = append(dst, `,"Partition":`...)
		dst = appendJSONString(dst, partition)
	}
	return dst
}

// appendStrings writes a []string as encoding/json does: null when nil.
func appendStrings(dst []byte, ss []string) []byte {
	if ss == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, s := range ss {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, s)
	}
	return append(dst, ']')
}

// appendStringMap writes a map[string]string as encoding/json does: null
// when nil, keys in sorted order.
func appendStringMap(dst []byte, m map[string]string) []byte {
	if m == nil {
		return append(dst, "null"...)
	}
	var buf [16]string
	keys := buf[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		dst = appendJSONString(dst, m[k])
	}
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString writes s as a JSON string with encoding/json's
// escaping: HTML's <, > and & as \u003c..., control bytes, invalid UTF-8
// as \ufffd, and U+2028 and U+2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
