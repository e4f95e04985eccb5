package consul

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/consul/api"
)

// countingAPI records the most concurrent reads it saw.
type countingAPI struct {
	catalogAPI
	now, most atomic.Int32
	gate      chan struct{}
}

func (c *countingAPI) ServiceEntries(string, *api.QueryOptions) ([]*wireEntry, *api.QueryMeta, error) {
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
