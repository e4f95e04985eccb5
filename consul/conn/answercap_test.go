package conn

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// TestAnswerCap: an answer of max bytes is read whole; one byte more is an
// error naming the path, after at most max bytes, also through consul/api
// (a KV read of an endless whitespace answer, as a hostile proxy sends).
func TestAnswerCap(t *testing.T) {
	const max = 1 << 10
	var size int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, strings.Repeat(" ", size-2)+"[]")
	}))
	t.Cleanup(srv.Close)
	rt := cappedTransport{base: http.DefaultTransport, max: max}
	for _, tc := range []struct {
		size int
		ok   bool
	}{{max, true}, {max + 1, false}, {100 * max, false}} {
		size = tc.size
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/kv/k", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if tc.ok != (err == nil) || len(b) > max || (err != nil && !strings.Contains(err.Error(), "/v1/kv/k")) {
			t.Errorf("answer of %d bytes: read %d, %v; want ok=%v, at most %d bytes, an error naming the path", tc.size, len(b), err, tc.ok, max)
		}
	}
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = strings.TrimPrefix(srv.URL, "http://")
	cfg.HttpClient = &http.Client{Transport: rt}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	size = 100 * max
	if _, _, err := c.KV().List("k", nil); err == nil || !strings.Contains(err.Error(), "over 1024 bytes") {
		t.Errorf("consul/api read of an endless answer: %v, want the cap's error", err)
	}
}
