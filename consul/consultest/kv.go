package consultest

import (
	"io"
	"net/http"
	"strconv"

	"github.com/hashicorp/consul/api"
)

// serveKV answers GET (one key), PUT (?cas=, ?acquire=, ?release=) and
// DELETE (?cas=) of a key.
func (s *Server) serveKV(w http.ResponseWriter, r *http.Request, key string) {
	q := r.URL.Query()
	var cas *uint64
	if v := q.Get("cas"); v != "" {
		i, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			http.Error(w, "Invalid cas index", http.StatusBadRequest)
			return
		}
		cas = &i
	}
	switch r.Method {
	case http.MethodGet:
		w.Header().Set("X-Consul-Index", strconv.FormatUint(max(s.max("kvs", "tombstones"), 1), 10))
		p := s.kv[key]
		if p == nil {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		c := *p
		writeJSON(w, s.max("kvs", "tombstones"), []*api.KVPair{&c})
	case http.MethodPut:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		flags, _ := strconv.ParseUint(q.Get("flags"), 10, 64)
		op := &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: body, Flags: flags}
		switch {
		case cas != nil:
			op.Verb, op.Index = api.KVCAS, *cas
		case q.Get("acquire") != "":
			op.Verb, op.Session = api.KVLock, q.Get("acquire")
		case q.Get("release") != "":
			op.Verb, op.Session = api.KVUnlock, q.Get("release")
		}
		_, errs := s.apply(api.TxnOps{{KV: op}})
		writeJSON(w, 0, strconv.FormatBool(len(errs) == 0))
	case http.MethodDelete:
		op := &api.KVTxnOp{Verb: api.KVDelete, Key: key}
		if cas != nil {
			op.Verb, op.Index = api.KVDeleteCAS, *cas
		}
		_, errs := s.apply(api.TxnOps{{KV: op}})
		writeJSON(w, 0, strconv.FormatBool(len(errs) == 0))
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}
