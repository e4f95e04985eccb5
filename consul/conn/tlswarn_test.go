package conn

import (
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

func TestInsecureTLSWarnings(t *testing.T) {
	const (
		unverified = "Consul's TLS certificate is not verified"
		clearToken = "The Consul ACL token is sent in clear text"
		clearAuth  = "The HTTP basic auth password (CONSUL_HTTP_AUTH) is sent in clear text"
	)
	skip := api.TLSConfig{InsecureSkipVerify: true}
	tests := []struct {
		name string
		cfg  api.Config
		want []string // prefixes, one per warning, in order
	}{
		{name: "https, verified, token", cfg: api.Config{Address: "consul:8501", Scheme: "https", Token: "t"}},
		{name: "plain http, no token", cfg: api.Config{Address: "consul:8500", Scheme: "http"}},
		{name: "https, verification off", cfg: api.Config{Address: "consul:8501", Scheme: "https", TLSConfig: skip},
			want: []string{unverified}},
		{name: "https:// address, verification off, token", cfg: api.Config{Address: "https://consul:8501", Scheme: "http", Token: "t", TLSConfig: skip},
			want: []string{unverified}},
		{name: "plain http with a token", cfg: api.Config{Address: "10.0.0.5:8500", Scheme: "http", Token: "t"},
			want: []string{clearToken}},
		{name: "plain http with a token file", cfg: api.Config{Address: "http://consul.consul.svc:8500", Token: "", TokenFile: "/t"},
			want: []string{clearToken}},
		{name: "plain http, verification off, token and basic auth", cfg: api.Config{Address: "consul:8500", Scheme: "http", Token: "t", TLSConfig: skip,
			HttpAuth: &api.HttpBasicAuth{Username: "u", Password: "p"}},
			want: []string{unverified, clearToken, clearAuth}},
		{name: "basic auth without a password", cfg: api.Config{Address: "consul:8500", HttpAuth: &api.HttpBasicAuth{Username: "u"}}},
		{name: "http:// address keeps an https scheme", cfg: api.Config{Address: "http://consul:8501", Scheme: "https", Token: "t"}},
		{name: "default address is this host", cfg: api.Config{Token: "t"}},
		{name: "loopback v4 with a token", cfg: api.Config{Address: "127.0.0.1:8500", Scheme: "http", Token: "t"}},
		{name: "loopback v6 with a token", cfg: api.Config{Address: "[::1]:8500", Scheme: "http", Token: "t"}},
		{name: "localhost with a reverse proxy prefix", cfg: api.Config{Address: "http://LOCALHOST:8500/consul", Token: "t"}},
		{name: "unix socket with a token", cfg: api.Config{Address: "unix:///var/run/consul.sock", Token: "t"}},
		{name: "not loopback, named like it", cfg: api.Config{Address: "localhost.example.com:8500", Scheme: "http", Token: "t"},
			want: []string{clearToken}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := insecureTLSWarnings(&tt.cfg)
			if len(got) != len(tt.want) {
				t.Fatalf("warnings %q, want %d starting %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(got[i], w) || strings.Contains(got[i], "\n") {
					t.Errorf("warning %d = %q, want one line starting %q", i, got[i], w)
				}
			}
		})
	}
}

// TestInsecureTLSWarningsFromEnvironment: consul/api's environment
// handling turns verification off for CONSUL_HTTP_SSL_VERIFY=false (and for
// a value that is not a boolean); the warning names the variable.
func TestInsecureTLSWarningsFromEnvironment(t *testing.T) {
	for _, v := range []string{"false", "0", "ture"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("CONSUL_HTTP_SSL", "true")
			t.Setenv("CONSUL_HTTP_SSL_VERIFY", v)
			got := insecureTLSWarnings(Config{Addresses: []string{"consul.example.com:8501"}}.apiConfig())
			if len(got) != 1 || !strings.Contains(got[0], "CONSUL_HTTP_SSL_VERIFY") || !strings.Contains(got[0], "consul.example.com:8501") {
				t.Errorf("CONSUL_HTTP_SSL_VERIFY=%s: warnings %q, want one naming the variable and the address", v, got)
			}
		})
	}
	t.Run("true", func(t *testing.T) {
		t.Setenv("CONSUL_HTTP_SSL", "true")
		t.Setenv("CONSUL_HTTP_SSL_VERIFY", "true")
		if got := insecureTLSWarnings(Config{Addresses: []string{"consul.example.com:8501"}}.apiConfig()); len(got) != 0 {
			t.Errorf("verified https: warnings %q", got)
		}
	})
	t.Run("after NewClient", func(t *testing.T) {
		t.Setenv("CONSUL_HTTP_SSL_VERIFY", "false")
		cfg := Config{Addresses: []string{"https://consul.example.com:8501"}, Token: "t"}.apiConfig()
		if _, err := api.NewClient(cfg); err != nil {
			t.Fatal(err)
		}
		if got := insecureTLSWarnings(cfg); len(got) != 1 || !strings.HasPrefix(got[0], "Consul's TLS certificate is not verified") {
			t.Errorf("after NewClient rewrote the config (%s, %s): warnings %q", cfg.Scheme, cfg.Address, got)
		}
	})
}
