package conn

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// TestConnWarnings: a connection's warnings are those of its configuration
// as given. NewAPIClient takes the token out of the configuration (the
// transport sets the header), so warnings read from it after Dial would
// miss a token sent in clear text. Dial sends no request.
func TestConnWarnings(t *testing.T) {
	const clearToken = "The Consul ACL token is sent in clear text"
	cn, err := Dial(context.Background(), Config{Addresses: []string{"10.0.0.5:8500"}, Token: "t"}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cn.InsecureTLSWarnings(); len(got) != 1 || !strings.HasPrefix(got[0], clearToken) {
		t.Errorf("Dial over plain http with a token: warnings %q, want one starting %q", got, clearToken)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cn, err = Dial(context.Background(), Config{Addresses: []string{"https://10.0.0.5:8501"}, TokenFile: file}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cn.InsecureTLSWarnings(); len(got) != 0 || !cn.TLS() || cn.TokenFile() != file || cn.URL() != "https://10.0.0.5:8501" {
		t.Errorf("Dial over https with a token file: warnings %q, tls %t, token file %q, url %s", got, cn.TLS(), cn.TokenFile(), cn.URL())
	}
	cn, err = Dial(context.Background(), Config{Addresses: []string{"10.0.0.5:8500"}, Token: "t"}, DialOptions{Login: &LoginConfig{AuthMethod: "k8s"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := cn.InsecureTLSWarnings(); len(got) != 0 {
		t.Errorf("Dial with a login: the configured token is not used, warnings %q", got)
	}
	cn, err = Open(Config{Addresses: []string{"10.0.0.5:8500"}, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cn.InsecureTLSWarnings(); len(got) != 1 || !strings.HasPrefix(got[0], clearToken) || cn.URL() != "http://10.0.0.5:8500" {
		t.Errorf("Open over plain http with a token: warnings %q, url %s", got, cn.URL())
	}
	if cn, err = Open(Config{Addresses: []string{"https://127.0.0.1:8501"}}); err != nil || cn.URL() != "https://127.0.0.1:8501" || !cn.TLS() {
		t.Errorf("Open of an https:// address: url %s, tls %t, err %v", cn.URL(), cn.TLS(), err)
	}
}

func TestSplitAddresses(t *testing.T) {
	addrs, scheme, err := SplitAddresses([]string{"https://a:8501", "b:8501/"}, "ignored:1")
	if err != nil || scheme != "https" || strings.Join(addrs, ",") != "a:8501,b:8501" {
		t.Fatalf("%v %q %v", addrs, scheme, err)
	}
	if addrs, scheme, err := SplitAddresses(nil, "127.0.0.1:8500"); err != nil || scheme != "" || len(addrs) != 1 || addrs[0] != "127.0.0.1:8500" {
		t.Fatalf("default: %v %q %v", addrs, scheme, err)
	}
	if _, _, err := SplitAddresses([]string{"https://a:1", "http://b:1"}, ""); err == nil {
		t.Fatal("mixed schemes accepted")
	}
}

// TestConnAsksForNoCompression: by default no request asks Consul to gzip
// its answer (Go's transport would, and Consul then compresses every
// answer); Config.Compression asks for it.
func TestConnAsksForNoCompression(t *testing.T) {
	open := map[string]func(Config) (*Conn, error){
		"Open": Open,
		"Dial": func(cc Config) (*Conn, error) { return Dial(t.Context(), cc, DialOptions{}) },
	}
	for _, how := range []string{"Open", "Dial"} {
		for _, gzip := range []bool{false, true} {
			testCompression(t, how, open[how], gzip)
		}
	}
}

func testCompression(t *testing.T, how string, open func(Config) (*Conn, error), gzip bool) {
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.Header.Get("Accept-Encoding"))
		w.Header().Set("X-Consul-Index", "7")
		_, _ = w.Write([]byte(`{"Services":[]}`))
	}))
	cn, err := open(Config{Addresses: []string{srv.URL}, Compression: gzip})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cn.Wire().NodeServices("k8s-gz", (&api.QueryOptions{}).WithContext(t.Context())); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	want := ""
	if gzip {
		want = "gzip"
	}
	if len(asked) != 1 || asked[0] != want {
		t.Errorf("%s, Compression %v: Accept-Encoding %q, want %q", how, gzip, asked, want)
	}
}
