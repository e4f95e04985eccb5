package watch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// TestHealthQueryShape records the health reads a Query makes: namespace
// and partition are Consul Enterprise's, so their request shape is what
// can be tested without one; a Query's fields override the Client's own,
// an empty field keeps them.
func TestHealthQueryShape(t *testing.T) {
	got := make(chan url.URL, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- *r.URL
		w.Header().Set("X-Consul-Index", "7")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	c := apiOf(t, srv)
	w := New(c, Options{Wait: time.Minute, MaxStale: -1, Datacenter: "dc0", Namespace: "ns0", Partition: "p0"})
	tests := []struct {
		name string
		q    Query
		want map[string]string // "" means absent
	}{
		{"the client's scope", Query{}, map[string]string{"dc": "dc0", "ns": "ns0", "partition": "p0", "tag": "", "filter": ""}},
		{"every field", Query{Datacenter: "dc2", Namespace: "team-a", Partition: "part-b", Tag: "blue", Filter: `Service.Meta.env == "prod"`},
			map[string]string{"dc": "dc2", "ns": "team-a", "partition": "part-b", "tag": "blue", "filter": `Service.Meta.env == "prod"`}},
		{"tag alone", Query{Tag: "v2"}, map[string]string{"dc": "dc0", "ns": "ns0", "partition": "p0", "tag": "v2", "filter": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, index, err := w.HealthQuery(context.Background(), "web", tt.q, 3)
			if err != nil || index != 7 {
				t.Fatalf("HealthQuery: index %d, %v", index, err)
			}
			u := <-got
			if u.Path != "/v1/health/service/web" {
				t.Errorf("path %s", u.Path)
			}
			v := u.Query()
			for k, want := range tt.want {
				if v.Get(k) != want || (want == "" && v.Has(k)) {
					t.Errorf("%s=%q (present %v), want %q", k, v.Get(k), v.Has(k), want)
				}
			}
			if v.Get("index") != "3" || v.Get("wait") != "60000ms" || v.Has("stale") {
				t.Errorf("index=%q wait=%q stale present %v", v.Get("index"), v.Get("wait"), v.Has("stale"))
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		what string
		err  error
		ok   bool
	}{
		{"dc1", ValidateDatacenter("dc1"), true},
		{"us_east-1", ValidateDatacenter("us_east-1"), true},
		{"DC1", ValidateDatacenter("DC1"), false},
		{"dc 1", ValidateDatacenter("dc 1"), false},
		{"empty dc", ValidateDatacenter(""), false},
		{"team-a", ValidateTenancy("team-a"), true},
		{"-a", ValidateTenancy("-a"), false},
		{"a_b", ValidateTenancy("a_b"), false},
		{"filter", ValidateFilter(`Service.Meta.env == "prod" and "blue" in Service.Tags`), true},
		{"bad filter", ValidateFilter(`Service.Meta.env ==`), false},
		{"empty filter", ValidateFilter(""), false},
	} {
		if (tt.err == nil) != tt.ok {
			t.Errorf("%s: %v, want ok %v", tt.what, tt.err, tt.ok)
		}
	}
}
