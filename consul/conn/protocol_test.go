package conn

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSpeaksHTTP2: a Dial connection (failover, token and answer-cap
// transports) to an HTTPS server that offers HTTP/2 speaks it, as Consul's
// HTTPS listener does; to one that does not, or over plain HTTP, it speaks
// HTTP/1.1; the probe carries the token like every request.
func TestSpeaksHTTP2(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tls, h2    bool
		want       bool
		wantProtos string
	}{
		{name: "https offering h2", tls: true, h2: true, want: true, wantProtos: "HTTP/2.0"},
		{name: "https without h2", tls: true, want: false, wantProtos: "HTTP/1.1"},
		{name: "plain http", want: false, wantProtos: "HTTP/1.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []string
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen = append(seen, r.Proto+" "+r.URL.Path+" "+r.Header.Get("X-Consul-Token"))
				_, _ = w.Write([]byte(`"127.0.0.1:8300"`))
			}))
			srv.EnableHTTP2 = tc.h2
			cc := Config{Token: "tok"}
			if tc.tls {
				srv.StartTLS()
				cc.CAPem = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
				cc.Addresses = []string{srv.URL}
			} else {
				srv.Start()
				cc.Addresses = []string{strings.TrimPrefix(srv.URL, "http://")}
			}
			defer srv.Close()
			cn, err := Dial(t.Context(), cc, DialOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := cn.SpeaksHTTP2(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			want := []string{tc.wantProtos + " /v1/status/leader tok"}
			if got != tc.want || strings.Join(seen, ",") != strings.Join(want, ",") {
				t.Errorf("SpeaksHTTP2 %t, the server saw %q; want %t and %q", got, seen, tc.want, want)
			}
		})
	}
}

// TestSpeaksHTTP2Unreachable: no answer is an error, not HTTP/1.1.
func TestSpeaksHTTP2Unreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	cn, err := Dial(t.Context(), Config{Addresses: []string{addr}}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cn.SpeaksHTTP2(t.Context()); err == nil || !strings.Contains(err.Error(), "consul protocol probe") {
		t.Errorf("probe of a closed port: error %v, want one naming the probe", err)
	}
}
