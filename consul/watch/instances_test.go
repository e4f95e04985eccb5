package watch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestHealthAnswerFlags: the health answer carries Consul's
// X-Consul-Results-Filtered-By-ACLs and says when the streaming backend
// (which never sets it) served it.
func TestHealthAnswerFlags(t *testing.T) {
	tests := []struct {
		name               string
		headers            map[string]string
		filtered, streamed bool
	}{
		{"whole, RPC backend", map[string]string{"X-Consul-Query-Backend": "blocking-query"}, false, false},
		{"filtered by ACLs", map[string]string{"X-Consul-Query-Backend": "blocking-query", "X-Consul-Results-Filtered-By-ACLs": "true"}, true, false},
		{"streaming backend", map[string]string{"X-Consul-Query-Backend": "streaming"}, false, true},
		{"no backend header (older Consul)", nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				for k, v := range tt.headers {
					w.Header().Set(k, v)
				}
				w.Header().Set("X-Consul-Index", "9")
				w.Header().Set("X-Consul-LastContact", "0")
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`[{"Node":{"Node":"vm1","Address":"10.0.0.1"},"Service":{"ID":"web-1","Service":"web","Port":80}}]`))
			}))
			defer srv.Close()
			c := apiOf(t, srv)
			got, index, err := New(c, Options{Wait: time.Minute, MaxStale: -1}).Health(context.Background(), "web", 3)
			if err != nil || index != 9 || len(got.Entries) != 1 {
				t.Fatalf("Health: %+v, index %d, %v", got, index, err)
			}
			if got.FilteredByACLs != tt.filtered || got.Streamed != tt.streamed {
				t.Errorf("FilteredByACLs %v Streamed %v, want %v %v", got.FilteredByACLs, got.Streamed, tt.filtered, tt.streamed)
			}
		})
	}
}
