package wire

import "encoding/json"

// decode decodes a 200 answer into out: the answers of the reads of owned
// state and of transactions in one pass with jscan (encoding/json's
// state machine ran over every byte twice, once to check the document and
// once to decode it, and was 43 % of a restart's CPU at 100,000 instances),
// anything else, and any answer jscan gives up
// on, with encoding/json. Both give the same values
// (TestScanDecodesAsEncodingJSON, FuzzScanDecode).
func decode(b []byte, out any) error {
	if scanDecode(b, out) {
		return nil
	}
	return json.Unmarshal(b, out)
}

// scanDecode decodes b into out when out is one of the lean answers, still
// zero (encoding/json would merge into what it holds), and jscan decodes
// all of b; out is untouched when it returns false.
func scanDecode(b []byte, out any) bool {
	s := newScan(b)
	switch o := out.(type) {
	case **NodeServices:
		if *o != nil || s.null() {
			return false
		}
		v := s.nodeServices()
		if !s.end() {
			return false
		}
		*o = v
	case *NodeServices:
		if o.Services != nil || s.null() {
			return false
		}
		v := s.nodeServices()
		if !s.end() {
			return false
		}
		*o = *v
	case *[]*Check:
		if *o != nil || s.null() {
			return false
		}
		var v []*Check
		s.array(1, func() { v = append(v, s.check(2)) })
		if !s.end() {
			return false
		}
		if v == nil {
			v = []*Check{}
		}
		*o = v
	case *[]*Entry:
		if *o != nil || s.null() {
			return false
		}
		var v []*Entry
		s.array(1, func() { v = append(v, s.entry(2)) })
		if !s.end() {
			return false
		}
		if v == nil {
			v = []*Entry{}
		}
		*o = v
	case *TxnResponse:
		if o.Results != nil || o.Errors != nil {
			return false
		}
		v, ok := s.txnResponse()
		if !ok || !s.end() {
			return false
		}
		*o = *v
	default:
		return false
	}
	return true
}

// optStr sets *dst to a string value; null leaves it (encoding/json).
func (s *jscan) optStr(dst *string) {
	if !s.null() {
		*dst = s.str()
	}
}

// optIStr is optStr for a string likely to repeat in the answer (istr).
func (s *jscan) optIStr(dst *string) {
	if !s.null() {
		*dst = s.istr()
	}
}

func (s *jscan) optUint(dst *uint64) {
	if !s.null() {
		*dst = s.uint()
	}
}

func (s *jscan) optInt(dst *int) {
	if !s.null() {
		*dst = s.int()
	}
}

var nodeServicesFields = fields{"Services"}

func (s *jscan) nodeServices() *NodeServices {
	v := &NodeServices{}
	s.object(nodeServicesFields, 1, func(int) {
		if s.null() {
			v.Services = nil
			return
		}
		v.Services = []*Service{}
		s.array(2, func() { v.Services = append(v.Services, s.service(3)) })
	})
	return v
}

var serviceFields = fields{"ID", "Service", "Address", "Port", "Weights", "Tags", "Meta", "Namespace", "ModifyIndex"}

// service decodes a Service (null is a nil element).
func (s *jscan) service(depth int) *Service {
	if s.null() {
		return nil
	}
	v := &Service{}
	s.object(serviceFields, depth, func(k int) {
		switch k {
		case 0:
			s.optStr(&v.ID)
		case 1:
			s.optIStr(&v.Service)
		case 2:
			s.optStr(&v.Address)
		case 3:
			s.optInt(&v.Port)
		case 4:
			if !s.null() {
				s.weights(depth+1, &v.Weights.Passing, &v.Weights.Warning)
			}
		case 5:
			v.Tags = s.strings(depth + 1)
		case 6:
			v.Meta = s.strMap(depth + 1)
		case 7:
			s.optIStr(&v.Namespace)
		case 8:
			s.optUint(&v.ModifyIndex)
		}
	})
	return v
}

var weightsFields = fields{"Passing", "Warning"}

func (s *jscan) weights(depth int, passing, warning *int) {
	s.object(weightsFields, depth, func(k int) {
		if k == 0 {
			s.optInt(passing)
		} else {
			s.optInt(warning)
		}
	})
}

var checkFields = fields{"CheckID", "ServiceID", "Status", "Output", "Namespace", "ModifyIndex"}

// check decodes a Check (null is a nil element).
func (s *jscan) check(depth int) *Check {
	if s.null() {
		return nil
	}
	v := &Check{}
	s.object(checkFields, depth, func(k int) {
		switch k {
		case 0:
			s.optStr(&v.CheckID)
		case 1:
			s.optStr(&v.ServiceID)
		case 2:
			s.optIStr(&v.Status)
		case 3:
			s.optIStr(&v.Output)
		case 4:
			s.optIStr(&v.Namespace)
		case 5:
			s.optUint(&v.ModifyIndex)
		}
	})
	return v
}

var (
	entryFields     = fields{"Node", "Service", "Checks"}
	entryNodeFields = fields{"Node"}
)

// entry decodes a Entry (null is a nil element).
func (s *jscan) entry(depth int) *Entry {
	if s.null() {
		return nil
	}
	v := &Entry{}
	s.object(entryFields, depth, func(k int) {
		switch k {
		case 0:
			if s.null() {
				return
			}
			v.Node = &struct{ Node string }{}
			s.object(entryNodeFields, depth+1, func(int) { s.optIStr(&v.Node.Node) })
		case 1:
			v.Service = s.service(depth + 1)
		case 2:
			if s.null() {
				return
			}
			v.Checks = []*Check{}
			s.array(depth+1, func() { v.Checks = append(v.Checks, s.check(depth+2)) })
		}
	})
	return v
}

var (
	txnFields        = fields{"Results", "Errors"}
	txnResultFields  = fields{"Node", "Service", "Check"}
	txnNodeFields    = fields{"Node", "Address", "Meta", "CreateIndex", "ModifyIndex"}
	txnServiceFields = fields{"ID", "ModifyIndex"}
	txnCheckFields   = fields{"CheckID", "ModifyIndex"}
)

// txnResponse decodes a transaction's 200 answer; a non-null Errors (only
// a rolled back transaction has them, and CommitTxn decodes that answer
// with encoding/json) is not decoded here: ok is false.
func (s *jscan) txnResponse() (v *TxnResponse, ok bool) {
	v = &TxnResponse{}
	ok = true
	s.object(txnFields, 0, func(k int) {
		if k == 1 {
			if !s.null() {
				ok = false
				s.skip(1)
			}
			return
		}
		if s.null() {
			return
		}
		v.Results = []TxnResult{}
		s.array(1, func() { v.Results = append(v.Results, s.txnResult(2)) })
	})
	return v, ok
}

func (s *jscan) txnResult(depth int) TxnResult {
	var r TxnResult
	if s.null() {
		return r
	}
	s.object(txnResultFields, depth, func(k int) {
		if s.null() {
			return
		}
		switch k {
		case 0:
			n := &struct {
				Node                     string
				Address                  string
				Meta                     map[string]string
				CreateIndex, ModifyIndex uint64
			}{}
			s.object(txnNodeFields, depth+1, func(k int) {
				switch k {
				case 0:
					s.optStr(&n.Node)
				case 1:
					s.optStr(&n.Address)
				case 2:
					n.Meta = s.strMap(depth + 2)
				case 3:
					s.optUint(&n.CreateIndex)
				case 4:
					s.optUint(&n.ModifyIndex)
				}
			})
			r.Node = n
		case 1:
			v := &struct {
				ID          string
				ModifyIndex uint64
			}{}
			s.idIndex(txnServiceFields, depth+1, &v.ID, &v.ModifyIndex)
			r.Service = v
		case 2:
			v := &struct {
				CheckID     string
				ModifyIndex uint64
			}{}
			s.idIndex(txnCheckFields, depth+1, &v.CheckID, &v.ModifyIndex)
			r.Check = v
		}
	})
	return r
}

// idIndex decodes an object of two fields, names[0] a string and names[1]
// an index (a transaction's service or check result).
func (s *jscan) idIndex(names fields, depth int, id *string, index *uint64) {
	s.object(names, depth, func(k int) {
		if k == 0 {
			s.optStr(id)
		} else {
			s.optUint(index)
		}
	})
}

// Decode decodes an answer as the reads do (decode), for the codec
// benchmarks (codecbench).
func Decode(b []byte, out any) error { return decode(b, out) }
