package k8s

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestOnServiceSeesServicesOnly: WatcherOptions.OnService is told of every
// Service add, update and delete, and of nothing about slices.
func TestOnServiceSeesServicesOnly(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	seen := make(chan Key, 100)
	_, c := startWatcherWith(t, client, WatcherOptions{Nodes: true, OnService: func(k Key) { seen <- k }})
	services := client.CoreV1().Services("shop")
	svc := newTestService("shop", "web")
	if _, err := services.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, web)
	slice := newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)), endpoint("p1", "10.0.0.1"))
	if _, err := client.DiscoveryV1().EndpointSlices("shop").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, web)
	if err := services.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, web)
	// The handler saw all three; OnService only the Service's two.
	for i := 0; i < 2; i++ {
		if k := <-seen; k != web {
			t.Fatalf("OnService got %v, want %v", k, web)
		}
	}
	select {
	case k := <-seen:
		t.Fatalf("OnService told of %v for a slice", k)
	default:
	}
}
