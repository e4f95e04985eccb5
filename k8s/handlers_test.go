package k8s

import (
	"reflect"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// calls is a Handler that records keys synchronously.
type calls []Key

func (c *calls) Changed(key Key) { *c = append(*c, key) }

// TestHandlers calls the informer event handlers directly, for the cases
// a fake API server cannot produce: tombstones and resyncs.
func TestHandlers(t *testing.T) {
	svc := newTestService("shop", "web")
	svcRV2 := newTestService("shop", "web")
	svcRV2.ResourceVersion = "2"
	// The slice handler gets slices as the informer keeps them.
	cached := func(s *discoveryv1.EndpointSlice) any {
		obj, err := compactSlice(s)
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
	raw := newTestSlice("shop", "web-a", "web", v4, nil)
	slice := cached(raw)
	sliceRV2 := newTestSlice("shop", "web-a", "web", v4, nil)
	sliceRV2.ResourceVersion = "2"
	moved := newTestSlice("shop", "web-a", "api", v4, nil)
	moved.ResourceVersion = "2"
	unlabelled := newTestSlice("shop", "web-a", "", v4, nil)
	unlabelled.ResourceVersion = "2"

	tests := []struct {
		name   string
		resync time.Duration
		event  func(services, slices cache.ResourceEventHandler)
		want   []Key
	}{
		{
			name:  "service tombstone uses its key",
			event: func(s, _ cache.ResourceEventHandler) { s.OnDelete(cache.DeletedFinalStateUnknown{Key: "shop/web"}) },
			want:  []Key{web},
		},
		{
			name:  "service tombstone with a bad key is ignored",
			event: func(s, _ cache.ResourceEventHandler) { s.OnDelete(cache.DeletedFinalStateUnknown{Key: "web"}) },
		},
		{
			name: "slice tombstone uses its last known label",
			event: func(_, s cache.ResourceEventHandler) {
				s.OnDelete(cache.DeletedFinalStateUnknown{Key: "shop/web-a", Obj: slice})
			},
			want: []Key{web},
		},
		{
			name: "slice tombstone without an object is ignored",
			event: func(_, s cache.ResourceEventHandler) {
				s.OnDelete(cache.DeletedFinalStateUnknown{Key: "shop/web-a"})
			},
		},
		{
			name:  "unchanged service update without resync is dropped",
			event: func(s, _ cache.ResourceEventHandler) { s.OnUpdate(svc, svc.DeepCopy()) },
		},
		{
			name:   "unchanged service update with resync notifies",
			resync: time.Minute,
			event:  func(s, _ cache.ResourceEventHandler) { s.OnUpdate(svc, svc.DeepCopy()) },
			want:   []Key{web},
		},
		{
			name:  "changed service update notifies",
			event: func(s, _ cache.ResourceEventHandler) { s.OnUpdate(svc, svcRV2) },
			want:  []Key{web},
		},
		{
			name:  "unchanged slice update without resync is dropped",
			event: func(_, s cache.ResourceEventHandler) { s.OnUpdate(slice, cached(raw.DeepCopy())) },
		},
		{
			name:   "unchanged slice update with resync notifies",
			resync: time.Minute,
			event:  func(_, s cache.ResourceEventHandler) { s.OnUpdate(slice, cached(raw.DeepCopy())) },
			want:   []Key{web},
		},
		{
			name:  "changed slice update notifies",
			event: func(_, s cache.ResourceEventHandler) { s.OnUpdate(slice, cached(sliceRV2)) },
			want:  []Key{web},
		},
		{
			name:  "slice moved to another service notifies both",
			event: func(_, s cache.ResourceEventHandler) { s.OnUpdate(slice, cached(moved)) },
			want:  []Key{web, api},
		},
		{
			name:  "slice losing its label notifies the old service",
			event: func(_, s cache.ResourceEventHandler) { s.OnUpdate(slice, cached(unlabelled)) },
			want:  []Key{web},
		},
		{
			name:  "unexpected object is ignored",
			event: func(s, _ cache.ResourceEventHandler) { s.OnAdd(&discoveryv1.EndpointSlice{}, false) },
		},
		{
			name:  "an EndpointSlice the transform did not see is ignored",
			event: func(_, s cache.ResourceEventHandler) { s.OnAdd(raw, false) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWatcher(fake.NewClientset(), tt.resync, nil)
			var got calls
			w.SetHandler(&got)
			tt.event(w.serviceHandler(), w.sliceHandler())
			if !reflect.DeepEqual([]Key(got), tt.want) {
				t.Errorf("Changed calls = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSetHandlerAfterStart checks that a late SetHandler is ignored.
func TestSetHandlerAfterStart(t *testing.T) {
	w, c := startWatcher(t, fake.NewClientset(), 0)
	var late calls
	w.SetHandler(&late)
	if w.handler != c {
		t.Error("SetHandler after Start replaced the handler")
	}
}
