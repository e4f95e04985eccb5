package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/consultest"
)

// TestConsulLoginFromEnv: consul-k8s's CONSUL_LOGIN_* variables set each
// login setting no flag sets; a flag wins over its variable; a static
// token flag wins over $CONSUL_LOGIN_AUTH_METHOD; bad meta names the
// variable.
func TestConsulLoginFromEnv(t *testing.T) {
	k8sEnv := map[string]string{
		"CONSUL_LOGIN_AUTH_METHOD": "consul-k8s-component-auth-method", "CONSUL_LOGIN_BEARER_TOKEN_FILE": "/env/token",
		"CONSUL_LOGIN_DATACENTER": "dc-primary", "CONSUL_LOGIN_META": "component=sync-catalog,pod=ns/name",
		"CONSUL_LOGIN_NAMESPACE": "ns-env", "CONSUL_LOGIN_PARTITION": "part-env",
	}
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    *conn.LoginConfig // nil: no login
		wantErr string
	}{
		{name: "no login", args: nil, env: map[string]string{"CONSUL_LOGIN_META": "a=b"}},
		{name: "all from consul-k8s's variables", env: k8sEnv, want: &conn.LoginConfig{AuthMethod: "consul-k8s-component-auth-method",
			BearerTokenFile: "/env/token", Datacenter: "dc-primary", Namespace: "ns-env", Partition: "part-env",
			Meta: map[string]string{"component": "sync-catalog", "pod": "ns/name"}}},
		{name: "flags win", env: k8sEnv, args: []string{"--consul-login-auth-method=mine", "--consul-login-bearer-token-file=/flag/token",
			"--consul-login-datacenter=dc-flag", "--consul-login-meta=team=infra", "--consul-login-namespace=ns-flag", "--consul-login-partition=part-flag"},
			want: &conn.LoginConfig{AuthMethod: "mine", BearerTokenFile: "/flag/token", Datacenter: "dc-flag", Namespace: "ns-flag",
				Partition: "part-flag", Meta: map[string]string{"team": "infra"}}},
		{name: "partition defaults to the scope's", env: map[string]string{"CONSUL_LOGIN_AUTH_METHOD": "m", "CONSUL_PARTITION": "part-scope"},
			want: &conn.LoginConfig{AuthMethod: "m", BearerTokenFile: conn.DefaultBearerTokenFile, Partition: "part-scope"}},
		{name: "a token flag wins over the variable's login", env: k8sEnv, args: []string{"--consul-token-file=/t"}},
		{name: "bad meta names the variable", env: map[string]string{"CONSUL_LOGIN_AUTH_METHOD": "m", "CONSUL_LOGIN_META": "component=x,oops"},
			wantErr: `environment variable CONSUL_LOGIN_META="component=x,oops"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseArgs(t, append([]string{"--cluster-id=x"}, c.args...), nil)
			if err != nil {
				t.Fatal(err)
			}
			get := func(k string) string { return c.env[k] }
			got, err := consulLogin(cfg, consulScope(cfg, get).Partition, get)
			switch {
			case c.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			case c.want == nil && got != nil:
				t.Fatalf("login %+v, want none", got)
			case c.want == nil:
				return
			case got == nil:
				t.Fatal("no login")
			}
			if got.AuthMethod != c.want.AuthMethod || got.BearerTokenFile != c.want.BearerTokenFile || got.Datacenter != c.want.Datacenter ||
				got.Namespace != c.want.Namespace || got.Partition != c.want.Partition || !equalMeta(got.Meta, c.want.Meta) {
				t.Fatalf("login\n%+v\nwant\n%+v", *got, *c.want)
			}
		})
	}
}

func equalMeta(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestOperatorCommandsLogIn: status and purge log in with the daemon's
// login flags, or with consul-k8s's CONSUL_LOGIN_* variables, against the
// twin with ACLs on (every request without a login token is refused), and
// log out when done; acl-setup, which needs a management token, does not
// take them.
func TestOperatorCommandsLogIn(t *testing.T) {
	twin := consultest.New(t)
	acl := twin.EnableACL("k8s-auth", "sa-jwt")
	bearer := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(bearer, []byte("sa-jwt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "--consul-address=" + twin.Addr()
	cases := []struct {
		name     string
		args     []string
		env      map[string]string
		code     int
		inStdout string
		inStderr string
		login    *consultest.Login // the login request wanted
	}{
		{name: "status with flags", args: []string{"status", addr, "--consul-login-auth-method=k8s-auth", "--consul-login-bearer-token-file=" + bearer,
			"--consul-login-meta=component=status", "--consul-login-datacenter=dc1"},
			inStdout: "No fleetsync cluster", login: &consultest.Login{Bearer: "sa-jwt", Meta: map[string]string{"component": "status"}, Datacenter: "dc1"}},
		{name: "status with consul-k8s's variables", args: []string{"status", addr},
			env: map[string]string{"CONSUL_LOGIN_AUTH_METHOD": "k8s-auth", "CONSUL_LOGIN_BEARER_TOKEN_FILE": bearer,
				"CONSUL_LOGIN_META": "component=sync-catalog", "CONSUL_LOGIN_NAMESPACE": "ns-1", "CONSUL_LOGIN_PARTITION": "part-1"},
			inStdout: "No fleetsync cluster", login: &consultest.Login{Bearer: "sa-jwt", Meta: map[string]string{"component": "sync-catalog"},
				Namespace: "ns-1", Partition: "part-1"}},
		{name: "purge with FLEETSYNC_ variables", args: []string{"purge", "--cluster-id=east", addr},
			env:      map[string]string{"FLEETSYNC_CONSUL_LOGIN_AUTH_METHOD": "k8s-auth", "FLEETSYNC_CONSUL_LOGIN_BEARER_TOKEN_FILE": bearer},
			inStdout: "cluster east has nothing to purge", login: &consultest.Login{Bearer: "sa-jwt"}},
		{name: "purge --yes with consul-k8s's variables", args: []string{"purge", "--cluster-id=east", "--yes", addr},
			env:      map[string]string{"CONSUL_LOGIN_AUTH_METHOD": "k8s-auth", "CONSUL_LOGIN_BEARER_TOKEN_FILE": bearer},
			inStdout: "cluster east has nothing to purge", login: &consultest.Login{Bearer: "sa-jwt"}},
		{name: "a flag wins over the variable", args: []string{"status", addr, "--consul-login-auth-method=nope"},
			env: map[string]string{"CONSUL_LOGIN_AUTH_METHOD": "k8s-auth", "CONSUL_LOGIN_BEARER_TOKEN_FILE": bearer}, code: 1,
			inStderr: `auth method "nope" refused`, login: &consultest.Login{Bearer: "sa-jwt"}},
		{name: "a refused bearer token", args: []string{"purge", "--cluster-id=east", addr, "--consul-login-auth-method=k8s-auth",
			"--consul-login-bearer-token-file=" + filepath.Join(t.TempDir(), "missing")}, code: 1, inStderr: "--consul-login-bearer-token-file"},
		{name: "no login: refused by the ACLs", args: []string{"status", addr}, code: 1, inStderr: "ACL not found"},
		{name: "acl-setup takes no login flag", args: []string{"acl-setup", "--cluster-id=east", addr, "--consul-login-auth-method=k8s-auth"},
			code: 2, inStderr: "flag provided but not defined: -consul-login-auth-method"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			before := len(acl.Logins())
			var out, errb bytes.Buffer
			code := run(c.args, &out, &errb)
			if code != c.code || !strings.Contains(out.String(), c.inStdout) || !strings.Contains(errb.String(), c.inStderr) {
				t.Fatalf("code %d (want %d)\nstdout %q (want %q)\nstderr %q (want %q)", code, c.code, out.String(), c.inStdout, errb.String(), c.inStderr)
			}
			logins := acl.Logins()[before:]
			if c.login == nil {
				if len(logins) != 0 {
					t.Fatalf("logins %+v, want none", logins)
				}
				return
			}
			if len(logins) != 1 {
				t.Fatalf("logins %+v, want one", logins)
			}
			l := logins[0]
			if l.Bearer != c.login.Bearer || l.Datacenter != c.login.Datacenter || l.Namespace != c.login.Namespace ||
				l.Partition != c.login.Partition || !equalMeta(l.Meta, c.login.Meta) {
				t.Fatalf("login %+v, want %+v", l, *c.login)
			}
			if n := acl.Live(); n != 0 {
				t.Fatalf("%d login tokens left: no logout", n)
			}
		})
	}
}
