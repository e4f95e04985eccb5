package consultest

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"
)

// Namespaces is the twin's Consul Enterprise namespaces (EnableNamespaces):
// GET /v1/namespace/<name> (404 for a missing one, which consul/api reads
// as none), PUT /v1/namespace (creates; an existing name answers 200 with
// the namespace, as Consul Enterprise does), and a service or check op
// into a namespace that does not exist fails its transaction with
// `Namespace "<name>" does not exist` (the text of Consul Enterprise's
// catalog error). "default" and "" always exist. What it serves is what
// consul-k8s's EnsureExists uses; it is not compared with an Enterprise
// server (none here). Its methods are safe for concurrent use.
type Namespaces struct {
	s    *Server
	have map[string]api.Namespace
	reqs []Request
}

// Request is one namespace request the twin received.
type Request struct {
	Method, Path, Query string // Query: the encoded query string
	Body                string
}

// EnableNamespaces turns namespaces on; names exist from the start.
func (s *Server) EnableNamespaces(names ...string) *Namespaces {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := &Namespaces{s: s, have: map[string]api.Namespace{}}
	for _, name := range names {
		n.have[name] = api.Namespace{Name: name}
	}
	s.ns = n
	return n
}

// Requests returns the namespace requests received, oldest first.
func (n *Namespaces) Requests() []Request {
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	return slices.Clone(n.reqs)
}

// Names returns the namespaces that exist, sorted ("default" left out).
func (n *Namespaces) Names() []string {
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	return slices.Sorted(maps.Keys(n.have))
}

// Get returns namespace name as created (false: it does not exist).
func (n *Namespaces) Get(name string) (api.Namespace, bool) {
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	ns, ok := n.have[name]
	return ns, ok
}

// Delete deletes a namespace (not what is in it: tests only).
func (n *Namespaces) Delete(name string) {
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	delete(n.have, name)
}

// serve answers a /v1/namespace request; s.mu is held.
func (n *Namespaces) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n.reqs = append(n.reqs, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body)})
	switch name, _ := strings.CutPrefix(r.URL.Path, "/v1/namespace/"); {
	case r.Method == http.MethodGet && name != "" && name != r.URL.Path:
		ns, ok := n.have[name]
		if !ok {
			http.Error(w, "Namespace not found", http.StatusNotFound)
			return
		}
		writeJSON(w, n.s.raft, ns)
	case r.Method == http.MethodPut && r.URL.Path == "/v1/namespace":
		var ns api.Namespace
		if err := json.Unmarshal(body, &ns); err != nil || ns.Name == "" {
			http.Error(w, fmt.Sprintf("Request decode failed: %v", err), http.StatusBadRequest)
			return
		}
		if cur, ok := n.have[ns.Name]; ok {
			writeJSON(w, n.s.raft, cur)
			return
		}
		n.s.raft++
		ns.CreateIndex, ns.ModifyIndex = n.s.raft, n.s.raft
		n.have[ns.Name] = ns
		writeJSON(w, n.s.raft, ns)
	default:
		http.Error(w, "consultest: not served: "+r.Method+" "+r.URL.Path, http.StatusNotFound)
	}
}

// missing is the error of an op into a namespace that does not exist (nil
// without namespaces); s.mu is held.
func (s *Server) missingNamespace(op *api.TxnOp) error {
	if s.ns == nil {
		return nil
	}
	var ns string
	switch {
	case op.Service != nil:
		ns = op.Service.Service.Namespace
	case op.Check != nil:
		ns = op.Check.Check.Namespace
	}
	if _, ok := s.ns.have[ns]; ok || ns == "" || ns == "default" {
		return nil
	}
	//lint:ignore ST1005 Consul's text
	return fmt.Errorf("Namespace %q does not exist", ns)
}
