package consul

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeACL copies what Consul's ACL endpoints do for a login: /v1/acl/login
// with a known bearer token creates a token; any other request with an
// unknown token gets 403 "ACL not found" (Consul's answer for a deleted or
// expired token); /v1/acl/logout deletes the token it carries.
type fakeACL struct {
	srv     *httptest.Server
	mu      sync.Mutex
	bearers map[string]bool   // accepted bearer tokens
	tokens  map[string]string // secret -> accessor
	logins  []string          // bearer tokens logged in with
	metas   []map[string]string
	dcs     []string
	n       int
	// dropAtOnce deletes every token right after it is created.
	dropAtOnce bool
}

func newFakeACL(t *testing.T, bearers ...string) *fakeACL {
	f := &fakeACL{bearers: map[string]bool{}, tokens: map[string]string{}}
	for _, b := range bearers {
		f.bearers[b] = true
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeACL) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case loginPath:
		if r.Header.Get("X-Consul-Token") != "" {
			http.Error(w, "login sent with a token", http.StatusBadRequest)
			return
		}
		var p api.ACLLoginParams
		_ = json.NewDecoder(r.Body).Decode(&p)
		f.logins = append(f.logins, p.BearerToken)
		f.metas = append(f.metas, p.Meta)
		f.dcs = append(f.dcs, r.URL.Query().Get("dc"))
		if p.AuthMethod != "k8s" {
			http.Error(w, fmt.Sprintf("auth method %q not found", p.AuthMethod), http.StatusForbidden)
			return
		}
		if !f.bearers[p.BearerToken] {
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		f.n++
		secret, accessor := fmt.Sprintf("secret-%04d", f.n), fmt.Sprintf("accessor-%04d", f.n)
		if !f.dropAtOnce {
			f.tokens[secret] = accessor
		}
		_ = json.NewEncoder(w).Encode(api.ACLToken{AccessorID: accessor, SecretID: secret})
	case logoutPath:
		tok := r.Header.Get("X-Consul-Token")
		if _, ok := f.tokens[tok]; !ok {
			http.Error(w, "ACL not found", http.StatusForbidden)
			return
		}
		delete(f.tokens, tok)
	default:
		if _, ok := f.tokens[r.Header.Get("X-Consul-Token")]; !ok {
			http.Error(w, "ACL not found", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte(`"127.0.0.1:8300"`))
	}
}

func (f *fakeACL) deleteAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.tokens)
}

func (f *fakeACL) loginCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.logins)
}

func (f *fakeACL) live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.tokens)
}

type loginSetup struct {
	ts   *TokenSource
	api  *api.Client
	file string
	logs *bytes.Buffer
	clk  *clocktesting.FakeClock
}

func newLoginSetup(t *testing.T, f *fakeACL, bearer, method string) loginSetup {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(bearer+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &bytes.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: &syncWriter{w: logs}, Level: hclog.Trace})
	ts, _ := NewTokenSource("", "", log)
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = strings.TrimPrefix(f.srv.URL, "http://")
	cfg.Datacenter = "dc1"
	c, err := NewAPIClient(cfg, ts)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	ts.UseLogin(c, LoginConfig{AuthMethod: method, BearerTokenFile: file, Meta: map[string]string{"pod": "ns/p"}, Clock: clk})
	return loginSetup{ts: ts, api: c, file: file, logs: logs, clk: clk}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestLoginAgainWithTheRotatedBearerToken: a request whose login token
// Consul deleted logs in again, with the bearer token file as it is now,
// and is sent again: the caller sees it succeed.
func TestLoginAgainWithTheRotatedBearerToken(t *testing.T) {
	f := newFakeACL(t, "bearer-A", "bearer-B")
	s := newLoginSetup(t, f, "bearer-A", "k8s")
	if err := s.ts.Login(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.Status().Leader(); err != nil {
		t.Fatalf("request with the login token: %v", err)
	}
	if err := os.WriteFile(s.file, []byte("bearer-B"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.deleteAll()
	if _, err := s.api.Status().Leader(); err != nil {
		t.Fatalf("request after the token was deleted: %v (want a new login and the request sent again)", err)
	}
	f.mu.Lock()
	logins, metas, dcs := append([]string(nil), f.logins...), f.metas, f.dcs
	f.mu.Unlock()
	if strings.Join(logins, ",") != "bearer-A,bearer-B" {
		t.Fatalf("logins with %v, want bearer-A then the rotated bearer-B", logins)
	}
	if metas[1]["pod"] != "ns/p" || dcs[1] != "dc1" {
		t.Fatalf("login meta %v, datacenter %q", metas[1], dcs[1])
	}
}

// TestLoginBackoff: a login token that is gone at once never makes a login
// loop: after a login with no successful request since, the next waits 1s,
// then 2s, 4s...; a successful request starts again from 1s.
func TestLoginBackoff(t *testing.T) {
	f := newFakeACL(t, "bearer-A")
	s := newLoginSetup(t, f, "bearer-A", "k8s")
	if err := s.ts.Login(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.dropAtOnce = true
	f.mu.Unlock()
	f.deleteAll()
	request := func() error { _, err := s.api.Status().Leader(); return err }

	// First refusal: one login at once (its token is gone too).
	if err := request(); err == nil || !strings.Contains(err.Error(), "ACL not found") {
		t.Fatalf("err %v, want ACL not found", err)
	}
	want := 2
	check := func(step string) {
		t.Helper()
		if n := f.loginCount(); n != want {
			t.Fatalf("%s: %d logins, want %d", step, n, want)
		}
	}
	check("first refusal")
	for range 5 {
		_ = request()
	}
	check("five more refusals within the backoff")
	for _, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		s.clk.Step(wait - time.Millisecond)
		_ = request()
		check(fmt.Sprintf("%s after the last login, less 1ms", wait))
		s.clk.Step(time.Millisecond)
		_ = request()
		want++
		check(fmt.Sprintf("%s after the last login", wait))
	}
	// Tokens last again: the next login works, a request succeeds, and a
	// later deletion logs in again at once.
	f.mu.Lock()
	f.dropAtOnce = false
	f.mu.Unlock()
	s.clk.Step(8 * time.Second)
	if err := request(); err != nil {
		t.Fatal(err)
	}
	want++
	check("after the backoff, tokens lasting")
	f.deleteAll()
	if err := request(); err != nil {
		t.Fatalf("a deletion after a success: %v", err)
	}
	want++
	check("a deletion after a success")
	// After that success the backoff starts again from MinBackoff: tokens
	// gone at once again are retried after 1s, not after the 16s reached
	// above.
	f.mu.Lock()
	f.dropAtOnce = true
	f.mu.Unlock()
	f.deleteAll()
	_ = request()
	want++
	check("a deletion after a success, tokens gone at once again")
	s.clk.Step(time.Second - time.Millisecond)
	_ = request()
	check("MinBackoff after it, less 1ms")
	s.clk.Step(time.Millisecond)
	_ = request()
	want++
	check("MinBackoff after it")
}

// TestLoginRefused: a bearer token the auth method refuses, or an auth
// method that does not exist, is a final error naming the method and the
// file; no secret is logged; Logout deletes the token and then does nothing.
func TestLoginRefusedAndLogout(t *testing.T) {
	f := newFakeACL(t, "bearer-A")
	bad := newLoginSetup(t, f, "bearer-X", "k8s")
	err := bad.ts.Login(t.Context())
	if !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), `"k8s"`) || !strings.Contains(err.Error(), bad.file) || !strings.Contains(err.Error(), "Permission denied") {
		t.Fatalf("err %v, want ErrLogin naming the auth method, the file and Consul's answer", err)
	}
	if err := newLoginSetup(t, f, "bearer-A", "nope").ts.Login(t.Context()); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("unknown auth method: %v", err)
	}

	s := newLoginSetup(t, f, "bearer-A", "k8s")
	if err := s.ts.Login(t.Context()); err != nil {
		t.Fatal(err)
	}
	secret := s.ts.Token()
	if f.live() != 1 || s.ts.Accessor() == "" {
		t.Fatalf("%d tokens, accessor %q", f.live(), s.ts.Accessor())
	}
	if err := s.ts.Logout(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f.live() != 0 || s.ts.Token() != "" {
		t.Fatalf("after logout: %d tokens in Consul, token kept %v", f.live(), s.ts.Token() != "")
	}
	if err := s.ts.Logout(t.Context()); err != nil {
		t.Fatalf("second logout: %v", err)
	}
	for _, l := range []string{s.logs.String(), bad.logs.String()} {
		if strings.Contains(l, secret) || strings.Contains(l, "bearer-") {
			t.Fatalf("a token in the log:\n%s", l)
		}
	}
	if !strings.Contains(s.logs.String(), "accessor-") {
		t.Fatalf("the log does not name the token's accessor:\n%s", s.logs.String())
	}
}
