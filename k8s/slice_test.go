package k8s

import (
	"runtime"
	"strings"
	"testing"
	"unsafe"
	"weak"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
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
