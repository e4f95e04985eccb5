package conn

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul/consultest"
)

// newFakeACL is a Consul twin with ACLs on: auth method "k8s" accepts
// bearers.
func newFakeACL(t *testing.T, bearers ...string) (*consultest.Server, *consultest.ACL) {
	twin := consultest.New(t)
	return twin, twin.EnableACL("k8s", bearers...)
}

type loginSetup struct {
	ts   *TokenSource
	api  *api.Client
	file string
	logs *bytes.Buffer
	clk  *clocktesting.FakeClock
}

func newLoginSetup(t *testing.T, twin *consultest.Server, bearer, method string) loginSetup {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(bearer+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &bytes.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: &syncWriter{w: logs}, Level: hclog.Trace})
	ts, _ := NewTokenSource("", "", log)
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = twin.Addr()
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
	twin, f := newFakeACL(t, "bearer-A", "bearer-B")
	s := newLoginSetup(t, twin, "bearer-A", "k8s")
	if err := s.ts.Login(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.Status().Leader(); err != nil {
		t.Fatalf("request with the login token: %v", err)
	}
	if err := os.WriteFile(s.file, []byte("bearer-B"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.DeleteAll()
	if _, err := s.api.Status().Leader(); err != nil {
		t.Fatalf("request after the token was deleted: %v (want a new login and the request sent again)", err)
	}
	logins := f.Logins()
	var bearers []string
	for _, l := range logins {
		bearers = append(bearers, l.Bearer)
	}
	if strings.Join(bearers, ",") != "bearer-A,bearer-B" {
		t.Fatalf("logins with %v, want bearer-A then the rotated bearer-B", bearers)
	}
	if logins[1].Meta["pod"] != "ns/p" || logins[1].Datacenter != "dc1" {
		t.Fatalf("login meta %v, datacenter %q", logins[1].Meta, logins[1].Datacenter)
	}
}

// TestLoginBackoff: a login token that is gone at once never makes a login
// loop: after a login with no successful request since, the next waits 1s,
// then 2s, 4s...; a successful request starts again from 1s.
func TestLoginBackoff(t *testing.T) {
	twin, f := newFakeACL(t, "bearer-A")
	s := newLoginSetup(t, twin, "bearer-A", "k8s")
	if err := s.ts.Login(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.DropAtOnce(true)
	f.DeleteAll()
	request := func() error { _, err := s.api.Status().Leader(); return err }

	// First refusal: one login at once (its token is gone too).
	if err := request(); err == nil || !strings.Contains(err.Error(), "ACL not found") {
		t.Fatalf("err %v, want ACL not found", err)
	}
	want := 2
	check := func(step string) {
		t.Helper()
		if n := len(f.Logins()); n != want {
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
	f.DropAtOnce(false)
	s.clk.Step(8 * time.Second)
	if err := request(); err != nil {
		t.Fatal(err)
	}
	want++
	check("after the backoff, tokens lasting")
	f.DeleteAll()
	if err := request(); err != nil {
		t.Fatalf("a deletion after a success: %v", err)
	}
	want++
	check("a deletion after a success")
	// After that success the backoff starts again from MinBackoff: tokens
	// gone at once again are retried after 1s, not after the 16s reached
	// above.
	f.DropAtOnce(true)
	f.DeleteAll()
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
	twin, f := newFakeACL(t, "bearer-A")
	bad := newLoginSetup(t, twin, "bearer-X", "k8s")
	err := bad.ts.Login(t.Context())
	if !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), `"k8s"`) || !strings.Contains(err.Error(), bad.file) || !strings.Contains(err.Error(), "Permission denied") {
		t.Fatalf("err %v, want ErrLogin naming the auth method, the file and Consul's answer", err)
	}
	if err := newLoginSetup(t, twin, "bearer-A", "nope").ts.Login(t.Context()); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("unknown auth method: %v", err)
	}

	s := newLoginSetup(t, twin, "bearer-A", "k8s")
	if err := s.ts.Login(t.Context()); err != nil {
		t.Fatal(err)
	}
	secret := s.ts.Token()
	if f.Live() != 1 || s.ts.Accessor() == "" {
		t.Fatalf("%d tokens, accessor %q", f.Live(), s.ts.Accessor())
	}
	if err := s.ts.Logout(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f.Live() != 0 || s.ts.Token() != "" {
		t.Fatalf("after logout: %d tokens in Consul, token kept %v", f.Live(), s.ts.Token() != "")
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
