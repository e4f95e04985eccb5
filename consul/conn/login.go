package conn

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/backoff"
)

const (
	loginPath  = "/v1/acl/login"
	logoutPath = "/v1/acl/logout"
)

// DefaultBearerTokenFile is where Kubernetes mounts a pod's ServiceAccount
// token (projected and rotated by the kubelet).
const DefaultBearerTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// LoginConfig says how to log in to Consul with an auth method
// (/v1/acl/login): the token every request carries is the one Consul
// returns, not a configured one.
type LoginConfig struct {
	// AuthMethod is the auth method's name (a Kubernetes one, typically,
	// as consul-k8s's manageSystemACLs creates).
	AuthMethod string
	// BearerTokenFile holds the bearer token (the pod's ServiceAccount
	// token); it is read again before every login, so a rotated projected
	// token is used.
	BearerTokenFile string
	// Meta is put on the token Consul creates (e.g. pod=<ns>/<name>).
	Meta map[string]string
	// Datacenter is where to log in (default: the client's datacenter).
	// The token must be valid where requests go: a local auth method's
	// tokens are local to its datacenter.
	Datacenter string
	// Namespace and Partition are the auth method's namespace and admin
	// partition (Enterprise; "": the default).
	Namespace string
	Partition string
	// MinBackoff and MaxBackoff bound the wait between two logins that
	// follow each other with no successful request between them
	// (defaults 1s and 1m): a token that is gone again at once (Consul
	// losing it, someone deleting every token) never makes a login loop.
	MinBackoff, MaxBackoff time.Duration
	// Clock is for tests (default the real clock).
	Clock clock.Clock
}

type login struct {
	cfg LoginConfig
	api *api.Client

	mu       sync.Mutex // serialises logins; guards the fields below
	accessor string     // of the current token (not secret; logged)
	next     time.Time  // no login before this
	retry    backoff.Backoff
	// sawOK is set when a request succeeded with a token; a login after
	// that starts the backoff again from MinBackoff.
	sawOK atomic.Bool
}

// ErrLogin is matched by the errors of Login that no retry mends (the auth
// method, the bearer token or the binding rules refuse): the error says which.
var ErrLogin = errors.New("consul login refused")

// UseLogin makes ts get its token by logging in with cfg through c (a
// client built on ts, see NewAPIClient). Call Login before the first request.
func (ts *TokenSource) UseLogin(c *api.Client, cfg LoginConfig) {
	if cfg.BearerTokenFile == "" {
		cfg.BearerTokenFile = DefaultBearerTokenFile
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(time.Minute, cfg.MinBackoff)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	ts.login = &login{cfg: cfg, api: c, retry: backoff.Backoff{Policy: backoff.Policy{Min: cfg.MinBackoff, Max: cfg.MaxBackoff}}}
}

// Login logs in now (at start). An error matching ErrLogin is final: the
// auth method, the bearer token or the binding rules refused; others
// (Consul unreachable, say) may pass.
func (ts *TokenSource) Login(ctx context.Context) error {
	l := ts.login
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return ts.loginLocked(ctx)
}

// relogin logs in again after a request with token used got "ACL not
// found"; it does nothing when another request already did (the token is
// no longer used), and refuses (an error) before the backoff has passed.
func (ts *TokenSource) relogin(ctx context.Context, used string) error {
	l := ts.login
	l.mu.Lock()
	defer l.mu.Unlock()
	if ts.Token() != used {
		return nil
	}
	now := l.cfg.Clock.Now()
	if l.sawOK.Swap(false) {
		l.retry.Reset()
	} else if now.Before(l.next) {
		return fmt.Errorf("consul login: next try in %s", l.next.Sub(now).Round(time.Millisecond))
	}
	ts.log.Warn("Consul does not know the login token (deleted or expired); logging in again", "auth_method", l.cfg.AuthMethod, "accessor_id", l.accessor)
	err := ts.loginLocked(ctx)
	l.next = now.Add(l.retry.Next())
	if err != nil {
		ts.log.Error("Cannot log in to Consul again", "auth_method", l.cfg.AuthMethod, "retry_in", l.next.Sub(now), "error", err)
	}
	return err
}

// loginLocked reads the bearer token and logs in; l.mu is held.
func (ts *TokenSource) loginLocked(ctx context.Context) error {
	l := ts.login
	b, err := os.ReadFile(l.cfg.BearerTokenFile)
	if err != nil {
		return fmt.Errorf("%w: read the bearer token file %s (--consul-login-bearer-token-file): %w", ErrLogin, l.cfg.BearerTokenFile, err)
	}
	bearer := strings.TrimSpace(string(b))
	if bearer == "" {
		return fmt.Errorf("%w: the bearer token file %s (--consul-login-bearer-token-file) is empty", ErrLogin, l.cfg.BearerTokenFile)
	}
	tok, _, err := l.api.ACL().Login(&api.ACLLoginParams{AuthMethod: l.cfg.AuthMethod, BearerToken: bearer, Meta: l.cfg.Meta},
		(&api.WriteOptions{Datacenter: l.cfg.Datacenter, Namespace: l.cfg.Namespace, Partition: l.cfg.Partition}).WithContext(ctx))
	if err != nil {
		var se api.StatusError
		if errors.As(err, &se) && se.Code >= 400 && se.Code < 500 {
			return fmt.Errorf("%w: auth method %q refused the bearer token from %s (%d %s): check that the auth method exists, that it can review tokens (its Kubernetes host, CA and reviewer token; the reviewer needs system:auth-delegator and get on serviceaccounts) and that a binding rule selects this ServiceAccount",
				ErrLogin, l.cfg.AuthMethod, l.cfg.BearerTokenFile, se.Code, se.Body)
		}
		return fmt.Errorf("consul login with auth method %q: %w", l.cfg.AuthMethod, err)
	}
	if tok == nil || tok.SecretID == "" {
		return fmt.Errorf("%w: auth method %q returned no token", ErrLogin, l.cfg.AuthMethod)
	}
	ts.token.Store(tok.SecretID)
	l.accessor = tok.AccessorID
	ts.log.Info("Logged in to Consul", "auth_method", l.cfg.AuthMethod, "accessor_id", tok.AccessorID,
		"policies", linkNames(tok.Policies), "roles", roleNames(tok.Roles), "service_identities", len(tok.ServiceIdentities))
	return nil
}

// Logout destroys the login token (at shutdown). Without login it does
// nothing; a token Consul no longer knows is not an error.
func (ts *TokenSource) Logout(ctx context.Context) error {
	l := ts.login
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tok := ts.Token()
	if tok == "" {
		return nil
	}
	_, err := l.api.ACL().Logout((&api.WriteOptions{Token: tok, Datacenter: l.cfg.Datacenter, Namespace: l.cfg.Namespace, Partition: l.cfg.Partition}).WithContext(ctx))
	var se api.StatusError
	if err != nil && !(errors.As(err, &se) && se.Code == http.StatusForbidden && strings.Contains(se.Body, "ACL not found")) {
		return fmt.Errorf("consul logout (token %s): %w", l.accessor, err)
	}
	ts.token.Store("")
	ts.log.Info("Logged out of Consul", "accessor_id", l.accessor)
	return nil
}

// Accessor is the AccessorID of the login token ("" without login); it
// is not a secret.
func (ts *TokenSource) Accessor() string {
	if ts.login == nil {
		return ""
	}
	ts.login.mu.Lock()
	defer ts.login.mu.Unlock()
	return ts.login.accessor
}

func linkNames(links []*api.ACLTokenPolicyLink) string {
	names := make([]string, 0, len(links))
	for _, l := range links {
		names = append(names, l.Name)
	}
	return strings.Join(names, ",")
}

func roleNames(links []*api.ACLTokenRoleLink) string {
	names := make([]string, 0, len(links))
	for _, l := range links {
		names = append(names, l.Name)
	}
	return strings.Join(names, ",")
}

// IsPermissionDenied reports a request that Consul refused for lack of
// ACL permission (403 "Permission denied"), which no retry mends.
func IsPermissionDenied(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code == http.StatusForbidden && strings.Contains(se.Body, "Permission denied")
	}
	return err != nil && strings.Contains(err.Error(), "Permission denied")
}
