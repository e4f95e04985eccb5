package main

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/consul/conn"
)

// TestConsulK8sEnvPrecedence: consul-k8s's variables fill what neither a
// flag nor Consul's own variable set, setting by setting, with
// consul-k8s's own order inside its pairs (token before token file, CA
// file before PEM).
func TestConsulK8sEnvPrecedence(t *testing.T) {
	k8s := map[string]string{
		"CONSUL_ADDRESSES": "consul-server.consul.svc", "CONSUL_HTTP_PORT": "8501", "CONSUL_USE_TLS": "true",
		"CONSUL_ACL_TOKEN": "k8s-token", "CONSUL_ACL_TOKEN_FILE": "/k8s/token",
		"CONSUL_CACERT_FILE": "/consul/tls/ca/tls.crt", "CONSUL_CACERT_PEM": "PEM",
	}
	with := func(extra map[string]string, drop ...string) map[string]string {
		m := map[string]string{}
		for k, v := range k8s {
			m[k] = v
		}
		for _, k := range drop {
			delete(m, k)
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name  string
		flags conn.Config
		env   map[string]string
		want  conn.Config
	}{
		{name: "nothing set", env: map[string]string{}, want: conn.Config{}},
		{name: "consul-k8s's variables alone", env: k8s, want: conn.Config{
			Addresses: []string{"consul-server.consul.svc:8501"}, SSL: true, TLSServerName: "consul-server.consul.svc",
			Token: "k8s-token", CAFile: "/consul/tls/ca/tls.crt"}},
		{name: "token file and PEM when the token and CA file are unset", env: with(nil, "CONSUL_ACL_TOKEN", "CONSUL_CACERT_FILE"), want: conn.Config{
			Addresses: []string{"consul-server.consul.svc:8501"}, SSL: true, TLSServerName: "consul-server.consul.svc",
			TokenFile: "/k8s/token", CAPem: []byte("PEM")}},
		{name: "default ports", env: map[string]string{"CONSUL_ADDRESSES": "10.0.0.1"}, want: conn.Config{Addresses: []string{"10.0.0.1:8500"}}},
		{name: "default TLS port, IPv6", env: map[string]string{"CONSUL_ADDRESSES": "fd00::1", "CONSUL_USE_TLS": "1"},
			want: conn.Config{Addresses: []string{"[fd00::1]:8501"}, SSL: true, TLSServerName: "fd00::1"}},
		{name: "flags win", flags: conn.Config{Addresses: []string{"flag:8500"}, SSL: true, Token: "flag-token", CAFile: "/flag/ca", TLSServerName: "flag-name"}, env: k8s,
			want: conn.Config{Addresses: []string{"flag:8500"}, SSL: true, Token: "flag-token", CAFile: "/flag/ca", TLSServerName: "flag-name"}},
		{name: "a token file flag wins over consul-k8s's token", flags: conn.Config{TokenFile: "/flag/token"}, env: map[string]string{"CONSUL_ACL_TOKEN": "k8s-token"},
			want: conn.Config{TokenFile: "/flag/token"}},
		{name: "Consul's own variables win", env: with(map[string]string{
			"CONSUL_HTTP_ADDR": "https://other:8501", "CONSUL_HTTP_SSL": "false", "CONSUL_HTTP_TOKEN_FILE": "/consul/token", "CONSUL_CACERT": "/consul/ca"}),
			want: conn.Config{}},
		{name: "Consul's server name wins over the inferred one", env: with(map[string]string{"CONSUL_TLS_SERVER_NAME": "server.dc1.consul"}), want: conn.Config{
			Addresses: []string{"consul-server.consul.svc:8501"}, SSL: true, Token: "k8s-token", CAFile: "/consul/tls/ca/tls.crt"}},
		{name: "no server name inferred without TLS", env: with(map[string]string{"CONSUL_USE_TLS": "false", "CONSUL_HTTP_PORT": "8500"}), want: conn.Config{
			Addresses: []string{"consul-server.consul.svc:8500"}, Token: "k8s-token", CAFile: "/consul/tls/ca/tls.crt"}},
		{name: "no server name inferred for a flag's address", flags: conn.Config{Addresses: []string{"10.0.0.9:8501"}}, env: with(nil, "CONSUL_ACL_TOKEN", "CONSUL_ACL_TOKEN_FILE", "CONSUL_CACERT_FILE", "CONSUL_CACERT_PEM"),
			want: conn.Config{Addresses: []string{"10.0.0.9:8501"}, SSL: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := withConsulK8sEnv(c.flags, func(k string) string { return c.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestConsulK8sEnvRefused: values fleetsync cannot use are errors naming
// the variable.
func TestConsulK8sEnvRefused(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"CONSUL_ADDRESSES": "exec=discover-servers"}, `CONSUL_ADDRESSES="exec=discover-servers": fleetsync does not run a command`},
		{map[string]string{"CONSUL_ADDRESSES": "a b"}, `CONSUL_ADDRESSES="a b": want one host name`},
		{map[string]string{"CONSUL_ADDRESSES": "consul", "CONSUL_HTTP_PORT": "http"}, `CONSUL_HTTP_PORT="http": want a port number`},
		{map[string]string{"CONSUL_ADDRESSES": "consul", "CONSUL_HTTP_PORT": "0"}, `CONSUL_HTTP_PORT="0"`},
		{map[string]string{"CONSUL_USE_TLS": "yes please"}, `CONSUL_USE_TLS="yes please": want true or false`},
	} {
		_, err := withConsulK8sEnv(conn.Config{}, func(k string) string { return c.env[k] })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.env, err, c.want)
		}
	}
}

// TestConsulK8sEnvTLS: consul-k8s's variables alone reach a TLS server
// whose CA comes as a PEM, verified against the host of CONSUL_ADDRESSES;
// without the CA the certificate is refused.
func TestConsulK8sEnvTLS(t *testing.T) {
	var hits int
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		if r.Header.Get("X-Consul-Token") != "k8s-token" {
			t.Errorf("token %q", r.Header.Get("X-Consul-Token"))
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	env := map[string]string{"CONSUL_ADDRESSES": u.Hostname(), "CONSUL_HTTP_PORT": u.Port(), "CONSUL_USE_TLS": "true",
		"CONSUL_ACL_TOKEN": "k8s-token", "CONSUL_CACERT_PEM": caPEM}
	read := func(env map[string]string) error {
		cc, err := withConsulK8sEnv(conn.Config{}, func(k string) string { return env[k] })
		if err != nil {
			return err
		}
		conn, err := conn.Open(cc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _, err = claim.Read(ctx, conn.API(), "fleetsync/clusters", "east")
		return err
	}
	if err := read(env); err != nil || hits != 1 {
		t.Fatalf("read with the PEM: %v, %d requests", err, hits)
	}
	delete(env, "CONSUL_CACERT_PEM")
	if err := read(env); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("read without the CA: %v, want a certificate error", err)
	}
}
