package wire

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"
)

// TestRawReadsAskWhatTheAPIClientAsks: for every read Raw sends, the
// path, query and token are those consul/api sends for the same options.
func TestRawReadsAskWhatTheAPIClientAsks(t *testing.T) {
	type seen struct {
		path   string
		query  url.Values
		header http.Header
	}
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		query := r.URL.Query()
		for _, v := range query {
			slices.Sort(v) // node-meta pairs come in map order
		}
		header := r.Header.Clone()
		header.Del("User-Agent")   // Go's default either way
		header.Del("Content-Type") // consul/api sets application/json on a GET, which carries no body
		header.Del("Accept-Encoding")
		got = append(got, seen{r.URL.EscapedPath(), query, header})
		mu.Unlock()
		w.Header().Set("X-Consul-Index", "7")
		_, _ = w.Write([]byte("null"))
	}))
	defer srv.Close()
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Datacenter, cfg.Token = strings.TrimPrefix(srv.URL, "http://"), "dc9", "static-token"
	cfg.HttpAuth = &api.HttpBasicAuth{Username: "proxy-user", Password: "proxy-secret"} // CONSUL_HTTP_AUTH
	c, err := api.NewClient(cfg)                                                        // completes cfg, as the daemon's Conn does
	if err != nil {
		t.Fatal(err)
	}
	viaAPI, viaRaw := API{C: c}, API{C: c, Raw: NewRaw(cfg)}
	if viaRaw.Raw == nil {
		t.Fatal("no raw reads for a plain http configuration")
	}
	options := []*api.QueryOptions{
		{},
		{Filter: `ID == "" and ID != ""`, NodeMeta: map[string]string{"k8s-cluster": "east", "external-source": "kubernetes"}},
		{Namespace: "team", Partition: "p1", Datacenter: "dc2", Token: "per-request", AllowStale: true, WaitIndex: 42},
	}
	for _, q := range options {
		for _, node := range []string{"k8s-east", "k8s-east.3", "odd name/with?chars"} {
			mu.Lock()
			got = nil
			mu.Unlock()
			for _, a := range []API{viaAPI, viaRaw} {
				for _, read := range []func() error{
					func() error { _, _, err := a.NodeServices(node, q); return err },
					func() error { _, _, err := a.NodeChecks(node, q); return err },
					func() error { _, _, err := a.ServiceEntries(node, q); return err },
				} {
					if err := read(); err != nil {
						t.Fatal(err)
					}
				}
			}
			mu.Lock()
			if len(got) != 6 {
				t.Fatalf("%d requests, want 6", len(got))
			}
			for i := range 3 {
				if !reflect.DeepEqual(got[i], got[i+3]) {
					t.Errorf("options %+v, node %q:\nconsul/api %+v\nraw        %+v", q, node, got[i], got[i+3])
				}
			}
			mu.Unlock()
		}
	}
}
