package watch

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: the feed's, the
// pollers' and the health queries' end with their contexts.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// apiOf is a consul/api client of srv.
func apiOf(t *testing.T, srv *httptest.Server) *api.Client {
	t.Helper()
	a, err := api.NewClient(&api.Config{Address: strings.TrimPrefix(srv.URL, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
