package consultest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-bexpr"
)

// Server is the twin. Its methods are safe for concurrent use.
type Server struct {
	srv *httptest.Server

	mu       sync.Mutex
	raft     uint64
	nodes    map[string]*node
	kv       map[string]*api.KVPair
	sessions map[string]*api.SessionEntry
	indexes  map[string]uint64
	fault    func(r *http.Request) error
	txns     int
	acl      *ACL        // nil: ACLs off
	ns       *Namespaces // nil: Consul OSS (no namespaces)
}

type node struct {
	api.Node
	services map[string]*api.AgentService
	checks   map[string]*api.HealthCheck
}

// New starts a twin; it stops when the test ends.
func New(t testing.TB) *Server {
	s := NewServer()
	t.Cleanup(s.Close)
	return s
}

// NewServer starts a twin; the caller must Close it.
func NewServer() *Server {
	s := &Server{raft: 10, nodes: map[string]*node{}, kv: map[string]*api.KVPair{}, sessions: map[string]*api.SessionEntry{}, indexes: map[string]uint64{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Close stops the twin (and its connections).
func (s *Server) Close() { s.srv.Close() }

// Addr is the twin's host:port.
func (s *Server) Addr() string { return strings.TrimPrefix(s.srv.URL, "http://") }

// Client is a consul/api client of the twin.
func (s *Server) Client() *api.Client {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token, cfg.TokenFile = s.Addr(), "http", "", ""
	c, err := api.NewClient(cfg)
	if err != nil {
		panic(err) // only a malformed address fails
	}
	return c
}

// SetFault makes every request for which f returns an error fail with a
// 500 and that error's text (nil f: none fail). f runs outside the twin's
// lock, after the request body is read, and may block until r's context
// ends (a Consul that never answers).
func (s *Server) SetFault(f func(r *http.Request) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}

// Txns counts the write transactions received (committed or not).
func (s *Server) Txns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.txns
}

// Services returns copies of the services on node (nil: no such node).
func (s *Server) Services(nodeName string) []*api.AgentService {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeName]
	if n == nil {
		return nil
	}
	out := make([]*api.AgentService, 0, len(n.services))
	for _, id := range slices.Sorted(maps.Keys(n.services)) {
		out = append(out, cloneService(n.services[id]))
	}
	return out
}

// Wipe forgets everything and lowers every index, as a Consul that lost
// its data (a new cluster, or a restore of an older snapshot) does.
func (s *Server) Wipe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes, s.kv, s.indexes, s.raft = map[string]*node{}, map[string]*api.KVPair{}, map[string]uint64{}, 10
	s.sessions = map[string]*api.SessionEntry{}
	if s.ns != nil {
		clear(s.ns.have)
	}
}

// Snapshot is the twin's state at one moment (see Restore).
type Snapshot struct {
	nodes   map[string]*node
	kv      map[string]*api.KVPair
	indexes map[string]uint64
}

// Snapshot saves the state, as a Consul snapshot does.
func (s *Server) Snapshot() *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := &Snapshot{nodes: map[string]*node{}, kv: map[string]*api.KVPair{}, indexes: maps.Clone(s.indexes)}
	for name, n := range s.nodes {
		snap.nodes[name] = cloneState(n)
	}
	for k, p := range s.kv {
		c := *p
		snap.kv[k] = &c
	}
	return snap
}

// Restore puts a snapshot's data and table indexes back, as restoring a
// Consul snapshot does: what was written since is gone and every index is
// what it was then (it goes back); later writes continue from the raft
// index, above everything written before the restore.
func (s *Server) Restore(snap *Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes, s.kv, s.indexes = map[string]*node{}, map[string]*api.KVPair{}, maps.Clone(snap.indexes)
	for name, n := range snap.nodes {
		s.nodes[name] = cloneState(n)
	}
	for k, p := range snap.kv {
		c := *p
		s.kv[k] = &c
	}
	s.raft++ // the restore is a raft entry of its own
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	// Read the body first: the server notices a client that gave up
	// (and cancels r's context) only once the body is read.
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.mu.Lock()
	fault := s.fault
	s.mu.Unlock()
	if fault != nil {
		if err := fault(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acl != nil && !s.acl.serve(w, r) {
		return
	}
	p := r.URL.Path
	rest := func(prefix string) (string, bool) {
		v, ok := strings.CutPrefix(p, prefix)
		return v, ok && v != ""
	}
	switch {
	case p == "/v1/txn" && r.Method == http.MethodPut:
		s.serveTxn(w, r)
	case p == "/v1/catalog/nodes" && r.Method == http.MethodGet:
		s.serveNodes(w, r)
	case p == "/v1/catalog/register" && r.Method == http.MethodPut:
		s.serveRegister(w, r)
	case p == "/v1/catalog/deregister" && r.Method == http.MethodPut:
		s.serveDeregister(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/catalog/node-services/"):
		name, _ := rest("/v1/catalog/node-services/")
		s.serveNodeServices(w, r, name)
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/catalog/node/"):
		name, _ := rest("/v1/catalog/node/")
		s.serveNode(w, r, name)
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/health/node/"):
		name, _ := rest("/v1/health/node/")
		s.serveNodeChecks(w, r, name)
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/health/service/"):
		name, _ := rest("/v1/health/service/")
		s.serveHealthService(w, r, name)
	case r.Method == http.MethodPut && strings.HasPrefix(p, "/v1/session/"):
		verb, id, _ := strings.Cut(strings.TrimPrefix(p, "/v1/session/"), "/")
		s.serveSession(w, r, verb, id)
	case p == "/v1/status/leader":
		writeJSON(w, 1, `"127.0.0.1:8300"`)
	case s.ns != nil && (p == "/v1/namespace" || strings.HasPrefix(p, "/v1/namespace/")):
		s.ns.serve(w, r)
	case strings.HasPrefix(p, "/v1/kv/"):
		key, ok := rest("/v1/kv/")
		if !ok {
			http.Error(w, "Missing key name", http.StatusBadRequest)
			return
		}
		s.serveKV(w, r, key)
	default:
		http.Error(w, "consultest: not served: "+r.Method+" "+p, http.StatusNotFound)
	}
}

func writeJSON(w http.ResponseWriter, index uint64, v any) {
	if index == 0 {
		index = 1 // Consul never answers index 0 (agent/http.go setIndex)
	}
	w.Header().Set("X-Consul-Index", strconv.FormatUint(index, 10))
	w.Header().Set("X-Consul-KnownLeader", "true")
	w.Header().Set("Content-Type", "application/json")
	if raw, ok := v.(string); ok {
		_, _ = w.Write([]byte(raw))
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// filter keeps the items matching the request's ?filter= expression.
func filter[T any](w http.ResponseWriter, r *http.Request, items []T) ([]T, bool) {
	expr := r.URL.Query().Get("filter")
	if expr == "" {
		return items, true
	}
	var zero T
	ev, err := bexpr.CreateEvaluatorForType(expr, nil, zero)
	if err != nil {
		http.Error(w, "Failed to create boolean expression evaluator: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	out := make([]T, 0, len(items))
	for _, it := range items {
		ok, err := ev.Evaluate(it)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return nil, false
		}
		if ok {
			out = append(out, it)
		}
	}
	return out, true
}

// metaMatches applies ?node-meta=k:v (all must match).
func metaMatches(r *http.Request, meta map[string]string) bool {
	for _, kv := range r.URL.Query()["node-meta"] {
		k, v, _ := strings.Cut(kv, ":")
		if meta[k] != v {
			return false
		}
	}
	return true
}

func (s *Server) max(names ...string) uint64 {
	var m uint64
	for _, n := range names {
		m = max(m, s.indexes[n])
	}
	return m
}

func (s *Server) serveTxn(w http.ResponseWriter, r *http.Request) {
	var ops api.TxnOps
	if err := json.NewDecoder(r.Body).Decode(&ops); err != nil {
		http.Error(w, "Failed to parse body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(ops) > 128 {
		http.Error(w, fmt.Sprintf("Transaction contains too many operations (%d > 128)", len(ops)), http.StatusRequestEntityTooLarge)
		return
	}
	results, errs := s.apply(ops)
	if len(errs) > 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(api.TxnResponse{Errors: errs})
		return
	}
	writeJSON(w, 0, api.TxnResponse{Results: results})
}

// apply runs ops all-or-nothing on a copy of the state, as one raft entry.
func (s *Server) apply(ops api.TxnOps) ([]*api.TxnResult, api.TxnErrors) {
	write := slices.ContainsFunc(ops, func(op *api.TxnOp) bool { return !isRead(op) })
	idx := s.raft
	if write {
		s.txns++
		s.raft++
		idx = s.raft
	}
	tx := &txn{s: s, idx: idx, nodes: map[string]*node{}, kv: maps.Clone(s.kv), indexes: maps.Clone(s.indexes)}
	for name, n := range s.nodes {
		tx.nodes[name] = cloneState(n)
	}
	var results []*api.TxnResult
	var errs api.TxnErrors
	for i, op := range ops {
		res, err := tx.do(op)
		if err != nil {
			errs = append(errs, &api.TxnError{OpIndex: i, What: err.Error()})
			continue
		}
		if res != nil {
			results = append(results, res)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	s.nodes, s.kv, s.indexes = tx.nodes, tx.kv, tx.indexes
	return results, nil
}

func isRead(op *api.TxnOp) bool {
	switch {
	case op.KV != nil:
		switch op.KV.Verb {
		case api.KVGet, api.KVGetOrEmpty, api.KVGetTree, api.KVCheckIndex, api.KVCheckSession, api.KVCheckNotExists:
			return true
		}
	case op.Node != nil:
		return op.Node.Verb == api.NodeGet
	case op.Service != nil:
		return op.Service.Verb == api.ServiceGet
	case op.Check != nil:
		return op.Check.Verb == api.CheckGet
	}
	return false
}

func cloneNode(n *api.Node) *api.Node {
	c := *n
	c.Meta, c.TaggedAddresses = maps.Clone(n.Meta), maps.Clone(n.TaggedAddresses)
	return &c
}

func cloneService(s *api.AgentService) *api.AgentService {
	c := *s
	c.Tags, c.Meta, c.TaggedAddresses = slices.Clone(s.Tags), maps.Clone(s.Meta), maps.Clone(s.TaggedAddresses)
	if c.Tags == nil {
		c.Tags = []string{} // Consul answers an empty list, not null
	}
	return &c
}

func cloneCheck(h *api.HealthCheck) *api.HealthCheck {
	c := *h
	c.ServiceTags = slices.Clone(h.ServiceTags)
	return &c
}

func cloneState(n *node) *node {
	c := &node{Node: *cloneNode(&n.Node), services: make(map[string]*api.AgentService, len(n.services)), checks: make(map[string]*api.HealthCheck, len(n.checks))}
	for id, s := range n.services {
		c.services[id] = cloneService(s)
	}
	for id, h := range n.checks {
		c.checks[id] = cloneCheck(h)
	}
	return c
}
