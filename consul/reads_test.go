package consul

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// countingAPI records the most concurrent reads it saw.
type countingAPI struct {
	catalogAPI
	now, most atomic.Int32
	gate      chan struct{}
}

func (c *countingAPI) ServiceEntries(string, *api.QueryOptions) ([]*wire.Entry, *api.QueryMeta, error) {
	n := c.now.Add(1)
	for {
		m := c.most.Load()
		if n <= m || c.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-c.gate
	c.now.Add(-1)
	return nil, &api.QueryMeta{}, nil
}

// TestReadsAreBounded: however many workers read at once, at most MaxReads
// requests are in flight.
func TestReadsAreBounded(t *testing.T) {
	fake := &countingAPI{gate: make(chan struct{})}
	c := newClient(fake, testOwner{id: "r"}, Options{MaxReads: 4})
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := c.ReadService(context.Background(), "web"); err != nil {
				t.Error(err)
			}
		}()
	}
	for fake.now.Load() < 4 { // wait until the first four are in flight
		runtime.Gosched()
	}
	for range 50 {
		fake.gate <- struct{}{}
	}
	wg.Wait()
	if got := fake.most.Load(); got != 4 {
		t.Fatalf("at most %d reads in flight, want 4", got)
	}
}

// indexAPI answers every read by name with index 42.
type indexAPI struct{ catalogAPI }

func (indexAPI) ServiceEntries(string, *api.QueryOptions) ([]*wire.Entry, *api.QueryMeta, error) {
	return nil, &api.QueryMeta{LastIndex: 42}, nil
}

// TestServiceIndexIsUnknownInEnterpriseScopes: with a Consul Enterprise
// namespace or partition the index a read by name answers is not trusted
// (0), so the anti-entropy gate never skips a read there.
func TestServiceIndexIsUnknownInEnterpriseScopes(t *testing.T) {
	for _, tc := range []struct {
		scope Scope
		want  uint64
	}{
		{Scope{}, 42},
		{Scope{Namespace: "default"}, 42},
		{Scope{Namespace: "team"}, 0},
		{Scope{Partition: "p1"}, 0},
		{Scope{MirrorNamespaces: true}, 0},
	} {
		c := newClient(indexAPI{}, testOwner{id: "ent"}, Options{Scope: tc.scope})
		i, err := c.ServiceIndex(t.Context(), "web")
		if err != nil {
			t.Fatal(err)
		}
		_, j, err := c.ReadService(t.Context(), "web")
		if err != nil {
			t.Fatal(err)
		}
		if i != tc.want || j != tc.want {
			t.Errorf("scope %+v: ServiceIndex %d, ReadService's %d, want %d", tc.scope, i, j, tc.want)
		}
	}
}
