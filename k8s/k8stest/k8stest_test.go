package k8stest

import (
	"context"
	"slices"
	"testing"

	"github.com/fleetsync/fleetsync/k8s"
)

type recorder []k8s.Key

func (r *recorder) Changed(key k8s.Key) { *r = append(*r, key) }

// TestWatcher: Set and Delete change the views and tell the handler;
// WaitForSync waits for Synced; Keys is sorted and runs the hook.
func TestWatcher(t *testing.T) {
	w := New()
	var got recorder
	w.SetHandler(&got)
	a, b := k8s.Key{Namespace: "ns", Name: "a"}, k8s.Key{Namespace: "ns", Name: "b"}
	w.Set(&k8s.Service{Key: b})
	w.Set(&k8s.Service{Key: a})
	listed := 0
	w.OnKeys(func() { listed++ })
	if keys := w.Keys(); !slices.Equal(keys, []k8s.Key{a, b}) || listed != 1 {
		t.Fatalf("Keys = %v (hook ran %d times), want [a b] and one run", keys, listed)
	}
	w.Delete(b)
	if _, ok, _ := w.Service(b); ok {
		t.Fatal("deleted Service still served")
	}
	if s, ok, _ := w.Service(a); !ok || s.Key != a {
		t.Fatalf("Service(a) = %v, %v", s, ok)
	}
	if !slices.Equal(got, recorder{b, a, b}) {
		t.Fatalf("handler told %v, want [b a b]", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if w.WaitForSync(ctx) {
		t.Fatal("synced before Synced")
	}
	w.Synced()
	w.Synced() // idempotent
	if !w.WaitForSync(context.Background()) {
		t.Fatal("not synced after Synced")
	}
}
