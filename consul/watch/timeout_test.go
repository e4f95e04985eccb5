package watch

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestHungReadsEndAtReadTimeout: reads at index 0 share the polls' few
// reads, so reads Consul never answers (a server stuck, a connection
// black-holed) must end at ReadTimeout, or they would hold every read and
// no other worker would read its service again.
func TestHungReadsEndAtReadTimeout(t *testing.T) {
	stop := make(chan struct{})
	var hung atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/health/service/hung") {
			hung.Add(1)
			select {
			case <-stop:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("X-Consul-Index", "7")
		_, _ = w.Write([]byte("[]"))
	}))
	defer srv.Close()
	defer close(stop) // before Close, which waits for the handlers
	a := apiOf(t, srv)
	const timeout = 200 * time.Millisecond
	c := New(a, Options{MaxWatches: 1, ReadTimeout: timeout})
	ctx := t.Context()
	errs := make(chan error, 8)
	began := time.Now()
	for i := range 8 { // every read the slots have
		go func() { _, _, err := c.Health(ctx, fmt.Sprintf("hung%d", i), 0); errs <- err }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for hung.Load() != 8 {
		if time.Now().After(deadline) {
			t.Fatalf("%d hung reads reached Consul, want 8", hung.Load())
		}
		time.Sleep(time.Millisecond) // no event to await: the server's count is the signal
	}
	ok := make(chan error, 1)
	go func() { _, _, err := c.Health(ctx, "ok", 0); ok <- err }()
	for range 8 {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), "no answer within "+timeout.String()) {
				t.Fatalf("a hung read ended with %v, want no answer within %s", err, timeout)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a hung read did not end at ReadTimeout")
		}
	}
	if d := time.Since(began); d < timeout {
		t.Fatalf("hung reads ended after %s, before ReadTimeout", d)
	}
	select {
	case err := <-ok:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read waited for ever behind reads Consul never answers")
	}
}
