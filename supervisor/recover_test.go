package supervisor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
)

// answer is a broken decoded answer: reading through it panics with a nil
// pointer dereference, as the readers did on a null element.
type answer struct{ nodes consul.NodesView }

// panickyRead is a Store whose first bootstrap read (ReadNode) and first
// node list read (ReadNodes) panic.
type panickyRead struct {
	*watchStore
	readNode, readNodes atomic.Int32
}

func (s *panickyRead) ReadNode(ctx context.Context) ([]consul.Registered, error) {
	if s.readNode.Add(1) == 1 {
		var a *answer
		_ = a.nodes
	}
	return s.watchStore.ReadNode(ctx)
}

func (s *panickyRead) ReadNodes(ctx context.Context) (consul.NodesView, error) {
	if s.readNodes.Add(1) == 1 {
		var a *answer
		return a.nodes, nil
	}
	return s.watchStore.ReadNodes(ctx)
}

// TestReadPanicsAreFailedReads: a panic in the bootstrap read and in the
// node check's read does not end the daemon: each is a failed read,
// retried (the bootstrap after its backoff, the check at its next
// interval), counted by read, and the fleet syncs.
func TestReadPanicsAreFailedReads(t *testing.T) {
	w, key := syncedWatcher("web", "10.1.0.1")
	clk := clocktesting.NewFakeClock(time.Now())
	store := &panickyRead{watchStore: newWatchStore()}
	m := NewMetrics(prometheus.NewRegistry(), PerWorker{})
	f := startOptions(t, w, store, func(o *Options) {
		o.Metrics, o.Clock, o.NodeCheckInterval = m, clk, time.Second
	}, nil)
	f.waitFor(t, "the bootstrap read's retry timer", func() bool { return store.readNode.Load() == 1 && clk.HasWaiters() })
	if got := testutil.ToFloat64(m.readPanics.WithLabelValues(readBootstrap)); got != 1 {
		t.Fatalf("read_panics_total{read=bootstrap} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.bootstrapFails); got != 1 {
		t.Fatalf("bootstrap_read_errors_total = %v, want 1 (the panic is a failed read)", got)
	}
	clk.Step(time.Second) // the retry
	f.waitFor(t, "1 instance", func() bool { return f.store.count("") == 1 })
	f.waitFor(t, "the first check's panic", func() bool { return store.readNodes.Load() == 1 })
	stepToNextCheck(t, f, clk, store.nodeReads) // the next check reads again
	if got := testutil.ToFloat64(m.readPanics.WithLabelValues(readNodeCheck)); got != 1 {
		t.Fatalf("read_panics_total{read=node_check} = %v, want 1", got)
	}
	w.set(key, service("ns", "web", "10.1.0.1", "10.1.0.2"))
	f.waitFor(t, "the fleet syncing on", func() bool { return f.store.count("") == 2 })
}
