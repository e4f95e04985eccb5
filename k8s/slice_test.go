package k8s

import (
	"context"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"
	"weak"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/consistencydetector"
)

// TestCompactSliceKeepsNotTheDecodedObject: once compacted, the decoded
// EndpointSlice (its endpoint array, object references and condition
// pointers) is garbage: the cache holds only the compact copy.
func TestCompactSliceKeepsNotTheDecodedObject(t *testing.T) {
	wire, err := realisticSlice("controller").Marshal()
	if err != nil {
		t.Fatal(err)
	}
	decoded := &discoveryv1.EndpointSlice{}
	if err := decoded.Unmarshal(wire); err != nil {
		t.Fatal(err)
	}
	object, endpoints := weak.Make(decoded), weak.Make(&decoded.Endpoints[0])
	obj, err := compactSlice(decoded)
	if err != nil {
		t.Fatal(err)
	}
	decoded = nil
	runtime.GC()
	if object.Value() != nil || endpoints.Value() != nil {
		t.Error("the compact slice keeps the decoded EndpointSlice or its endpoint array")
	}
	c := obj.(*cachedSlice)
	if key, ok := c.serviceKey(); !ok || key != (Key{Namespace: "payments", Name: "checkout-api"}) || len(c.endpoints) != 10 {
		t.Errorf("compacted to %+v", c)
	}
	runtime.KeepAlive(obj)
}

// TestCompactSliceTwice: the transform leaves what it made, and a
// tombstone, as they are (the informer may hand either back).
func TestCompactSliceTwice(t *testing.T) {
	once, err := compactSlice(newTestSlice("shop", "web-a", "web", v4, nil))
	if err != nil {
		t.Fatal(err)
	}
	if twice, _ := compactSlice(once); twice != once {
		t.Error("a compacted slice was compacted again")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "shop/web-a", Obj: once}
	if got, _ := compactSlice(tomb); got != any(tomb) {
		t.Errorf("tombstone became %T", got)
	}
}

// TestCompactSliceSharesNodeNames: endpoints on one node keep one copy of
// its name, however many decoded copies there were.
func TestCompactSliceSharesNodeNames(t *testing.T) {
	node := func() *string { s := strings.Clone("ip-10-0-1-17.eu-west-1.compute.internal"); return &s }
	a, b := endpoint("a", "10.0.0.1"), endpoint("b", "10.0.0.2")
	a.NodeName, b.NodeName = node(), node()
	if unsafe.StringData(*a.NodeName) == unsafe.StringData(*b.NodeName) {
		t.Fatal("test needs two copies of the node name")
	}
	obj, err := compactSlice(newTestSlice("shop", "web-a", "web", v4, nil, a, b))
	if err != nil {
		t.Fatal(err)
	}
	eps := obj.(*cachedSlice).endpoints
	if eps[0].node != *a.NodeName || unsafe.StringData(eps[0].node) != unsafe.StringData(eps[1].node) {
		t.Errorf("node names %q and %q are not one copy", eps[0].node, eps[1].node)
	}
}

// TestCompactSlicesPassTheWatchListConsistencyCheck: client-go's check of
// a watch-list sync (on with KUBE_WATCHLIST_INCONSISTENCY_DETECTOR) runs
// the transform over a fresh list and compares the results, as
// runtime.Objects, with the cache: compact slices pass it, and a copy
// shares nothing with its original.
func TestCompactSlicesPassTheWatchListConsistencyCheck(t *testing.T) {
	a, b := realisticSlice("controller"), realisticSlice("fixture")
	a.UID, b.UID, b.Name = "uid-a", "uid-b", "other"
	list := &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: []discoveryv1.EndpointSlice{*a.DeepCopy(), *b.DeepCopy()}}
	var cached []any
	for _, s := range []*discoveryv1.EndpointSlice{a, b} {
		obj, err := compactSlice(s)
		if err != nil {
			t.Fatal(err)
		}
		cached = append(cached, obj)
	}
	listFn := func(context.Context, metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) { return list, nil }
	consistencydetector.CheckDataConsistency(t.Context(), "EndpointSlice", "7", listFn, compactSlice, metav1.ListOptions{}, func() []any { return cached })

	orig := cached[0].(*cachedSlice)
	cp := orig.DeepCopyObject().(*cachedSlice)
	if !reflect.DeepEqual(cp, orig) {
		t.Fatalf("copy %+v differs from %+v", cp, orig)
	}
	cp.endpoints[0].addresses[0], *cp.ports[0].Port, cp.Name = "10.9.9.9", 1, "changed"
	if orig.endpoints[0].addresses[0] == "10.9.9.9" || *orig.ports[0].Port == 1 || orig.Name == "changed" {
		t.Error("the copy shares state with the original")
	}
}
