package consultest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/hashicorp/consul/api"
)

// ACL is the twin's ACL system for logins (EnableACL): /v1/acl/login with
// the auth method and a known bearer token creates a token; any other
// request without a live token gets 403 "ACL not found" (Consul's answer
// for a deleted or expired token); /v1/acl/logout deletes the token it
// carries. Its methods are safe for concurrent use.
type ACL struct {
	s       *Server
	method  string
	bearers map[string]bool
	tokens  map[string]string // secret -> accessor
	logins  []Login
	n       int
	drop    bool
}

// Login is one login request the twin received.
type Login struct {
	Bearer     string
	Meta       map[string]string
	Datacenter string // the ?dc= it was sent with
	Namespace  string // the ?ns= it was sent with
	Partition  string // the ?partition= it was sent with
}

// EnableACL turns token checks on: method is the one auth method, bearers
// the bearer tokens it accepts.
func (s *Server) EnableACL(method string, bearers ...string) *ACL {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := &ACL{s: s, method: method, bearers: map[string]bool{}, tokens: map[string]string{}}
	for _, b := range bearers {
		a.bearers[b] = true
	}
	s.acl = a
	return a
}

// DeleteAll deletes every token (as an operator or a TTL would).
func (a *ACL) DeleteAll() {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	clear(a.tokens)
}

// DropAtOnce makes every token created from now on vanish at once (true).
func (a *ACL) DropAtOnce(drop bool) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	a.drop = drop
}

// Logins returns the login requests received, oldest first.
func (a *ACL) Logins() []Login {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	return slices.Clone(a.logins)
}

// Live counts the tokens that exist.
func (a *ACL) Live() int {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	return len(a.tokens)
}

// serve answers the ACL endpoints, and refuses any other request without
// a live token (false: the request was answered); s.mu is held.
func (a *ACL) serve(w http.ResponseWriter, r *http.Request) bool {
	tok := r.Header.Get("X-Consul-Token")
	switch r.URL.Path {
	case "/v1/acl/login":
		if tok != "" {
			http.Error(w, "login sent with a token", http.StatusBadRequest)
			return false
		}
		var p api.ACLLoginParams
		_ = json.NewDecoder(r.Body).Decode(&p)
		a.logins = append(a.logins, Login{Bearer: p.BearerToken, Meta: maps.Clone(p.Meta), Datacenter: r.URL.Query().Get("dc"),
			Namespace: r.URL.Query().Get("ns"), Partition: r.URL.Query().Get("partition")})
		if p.AuthMethod != a.method {
			http.Error(w, fmt.Sprintf("auth method %q not found", p.AuthMethod), http.StatusForbidden)
			return false
		}
		if !a.bearers[p.BearerToken] {
			http.Error(w, "Permission denied", http.StatusForbidden)
			return false
		}
		a.n++
		secret, accessor := fmt.Sprintf("secret-%04d", a.n), fmt.Sprintf("accessor-%04d", a.n)
		if !a.drop {
			a.tokens[secret] = accessor
		}
		writeJSON(w, 0, api.ACLToken{AccessorID: accessor, SecretID: secret})
		return false
	case "/v1/acl/logout":
		if _, ok := a.tokens[tok]; !ok {
			http.Error(w, "ACL not found", http.StatusForbidden)
			return false
		}
		delete(a.tokens, tok)
		return false
	}
	if _, ok := a.tokens[tok]; !ok {
		http.Error(w, "ACL not found", http.StatusForbidden)
		return false
	}
	return true
}
