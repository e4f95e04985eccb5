package shard

import (
	"context"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestLeaseWatchRetriesARefusedListWithinASecond: while the API server
// refuses connections, the Lease list is retried at most a second apart on
// the manager's clock (k8s.Patient), so the Leases are seen again as soon
// as it answers; client-go's reflector alone would wait 0.8 s, 1.6 s,
// 3.2 s... of real time between tries.
func TestLeaseWatchRetriesARefusedListWithinASecond(t *testing.T) {
	const refusals = 6
	client := fake.NewClientset()
	var lists atomic.Int32
	client.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) <= refusals {
			return true, nil, &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/apis/coordination.k8s.io/v1/leases",
				Err: &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}}
		}
		return false, nil, nil
	})
	f, _ := newFleet(t)
	clk := newClock()
	m := newManager(testConfig(2), Deps{Client: client, ClusterID: "c", Fleet: f, Clock: clk})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	synced := make(chan error, 1)
	go func() {
		stop, err := m.watch(ctx)
		t.Cleanup(stop)
		synced <- err
	}()
	// Step the manager's clock a second per refusal; real time allowed for
	// all of it: 3 s (the reflector's own waits would sum to 20 s or more).
	deadline := time.After(3 * time.Second)
	for {
		select {
		case err := <-synced:
			if err != nil {
				t.Fatalf("lease watch: %v", err)
			}
			if n := lists.Load(); n != refusals+1 {
				t.Errorf("%d lists, want %d", n, refusals+1)
			}
			return
		case <-deadline:
			t.Fatalf("the Lease watch had not synced 3 s after its first refused list (%d lists): the retries wait out a backoff", lists.Load())
		case <-time.After(time.Millisecond):
			if clk.HasWaiters() {
				clk.Step(time.Second)
			}
		}
	}
}
