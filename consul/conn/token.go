package conn

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
)

// TokenSource holds the ACL token every request carries. With a token file
// (CONSUL_HTTP_TOKEN_FILE, a mounted Kubernetes Secret) it re-reads the file
// so that a rotated Secret takes effect without a restart. The token itself
// is never logged or put in an error.
type TokenSource struct {
	path  string
	token atomic.Value // string
	log   hclog.Logger
	// login, when set, is where the token comes from (see UseLogin).
	login *login
}

// NewTokenSource returns a source with a fixed token, or, when path is set,
// the token read from path (an error names the file, never the content).
func NewTokenSource(token, path string, log hclog.Logger) (*TokenSource, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ts := &TokenSource{path: path, log: log}
	ts.token.Store(token)
	if path != "" {
		t, err := readToken(path)
		if err != nil {
			return nil, err
		}
		ts.token.Store(t)
	}
	return ts, nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read consul token file %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Token returns the current token.
func (ts *TokenSource) Token() string { return ts.token.Load().(string) }

// Watch re-reads the token file every interval until ctx is done, then
// returns nil (at once without a file). A read error keeps the previous
// token and is logged, not returned. Run it in the process's errgroup.
func (ts *TokenSource) Watch(ctx context.Context, interval time.Duration) error {
	if ts.path == "" || ts.login != nil {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
		t, err := readToken(ts.path)
		switch {
		case err != nil:
			ts.log.Warn("Cannot re-read the Consul token file; keeping the current token", "error", err)
		case t != ts.Token():
			ts.token.Store(t)
			ts.log.Info("Consul token file changed; using the new token", "file", ts.path)
		}
	}
}

// Transport wraps base so that every request carries the current token
// (overriding any token consul/api set from its own configuration).
func (ts *TokenSource) Transport(base http.RoundTripper) http.RoundTripper {
	return tokenTransport{base: base, ts: ts}
}

type tokenTransport struct {
	base http.RoundTripper
	ts   *TokenSource
}

func (t tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == loginPath {
		// A login carries the bearer token in its body, no ACL token.
		r := req.Clone(req.Context())
		r.Header.Del("X-Consul-Token")
		return t.base.RoundTrip(r)
	}
	tok := t.ts.Token()
	resp, err := t.send(req, tok)
	l := t.ts.login
	if err != nil || l == nil || resp.StatusCode != http.StatusForbidden || req.URL.Path == logoutPath {
		if err == nil && l != nil && resp.StatusCode < 300 {
			l.sawOK.Store(true)
		}
		return resp, err
	}
	if !aclNotFound(resp) {
		return resp, nil
	}
	// The token is gone (deleted, expired): log in again (once for all
	// requests that saw it, never more often than the backoff allows) and
	// send the request again with the new token.
	if lerr := t.ts.relogin(req.Context(), tok); lerr != nil {
		return resp, nil
	}
	if req.Body != nil && req.GetBody == nil {
		return resp, nil
	}
	r := req.Clone(req.Context())
	if req.GetBody != nil {
		b, gerr := req.GetBody()
		if gerr != nil {
			return resp, nil
		}
		r.Body = b
	}
	resp.Body.Close()
	resp, err = t.send(r, t.ts.Token())
	if err == nil && resp.StatusCode < 300 {
		l.sawOK.Store(true)
	}
	return resp, err
}

func (t tokenTransport) send(req *http.Request, tok string) (*http.Response, error) {
	if tok == "" {
		return t.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	r.Header.Set("X-Consul-Token", tok)
	return t.base.RoundTrip(r)
}

// aclNotFound reports a 403 "ACL not found" (the token does not exist, or
// expired), keeping the body readable.
func aclNotFound(resp *http.Response) bool {
	if resp.Body == nil {
		return false
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return strings.Contains(string(b), "ACL not found")
}

// NewAPIClient builds a consul/api client whose requests carry ts's token
// and use cfg's TLS settings; with servers (nil: cfg.Address alone) they go
// to one of several addresses and fail over (see Servers). No answer's
// body is read past maxAnswer bytes.
func NewAPIClient(cfg *api.Config, ts *TokenSource, servers ...*Servers) (*api.Client, error) {
	if cfg.Transport == nil {
		cfg.Transport = api.DefaultConfig().Transport
	}
	hc, err := api.NewHttpClient(cfg.Transport, cfg.TLSConfig)
	if err != nil {
		return nil, fmt.Errorf("consul TLS configuration: %w", err)
	}
	if len(servers) > 0 && servers[0] != nil {
		s := servers[0]
		if name := s.ResolvedName(); name != "" {
			if t, ok := hc.Transport.(*http.Transport); ok && t.TLSClientConfig != nil && t.TLSClientConfig.ServerName == "" {
				// Requests go to the name's addresses: the
				// certificate is still the name's.
				t.TLSClientConfig.ServerName = name
			}
		}
		hc.Transport = s.Transport(hc.Transport)
		cfg.Address = s.Current()
	}
	hc.Transport = cappedTransport{base: ts.Transport(hc.Transport), max: maxAnswer}
	cfg.HttpClient = hc
	cfg.Token, cfg.TokenFile = "", "" // the transport sets the header
	return api.NewClient(cfg)
}
