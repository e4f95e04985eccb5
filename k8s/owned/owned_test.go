package owned

import (
	"context"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestCacheIndexesSlicesByService(t *testing.T) {
	mark := map[string]string{"m": "1", discoveryv1.LabelServiceName: "web"}
	objs := []*discoveryv1.EndpointSlice{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-b", Labels: mark}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-a", Labels: mark}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "web-a", Labels: mark}},
	}
	client := fake.NewClientset(objs[0], objs[1], objs[2],
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", Labels: map[string]string{"m": "1"}}})
	c := New(client, "m=1", "")
	var mu sync.Mutex
	seen := map[Key]int{}
	c.SetHandler(func(k Key) { mu.Lock(); seen[k]++; mu.Unlock() })
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); c.Wait() }()
	c.Start(ctx)
	if !c.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	got := c.Slices("ns", "web")
	if len(got) != 2 || got[0].Name != "web-a" || got[1].Name != "web-b" {
		t.Fatalf("slices of ns/web: %v", got)
	}
	if _, ok := c.Service("ns", "db"); !ok {
		t.Fatal("service ns/db not cached")
	}
	keys := c.Keys()
	if len(keys) != 3 || keys[0] != (Key{"ns", "db"}) || keys[1] != (Key{"ns", "web"}) || keys[2] != (Key{"other", "web"}) {
		t.Fatalf("keys %v", keys)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[Key{"ns", "web"}] != 2 || seen[Key{"ns", "db"}] != 1 {
		t.Fatalf("notified %v", seen)
	}
}
