package k8s

import (
	"context"
	"reflect"
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

var (
	web = Key{Namespace: "shop", Name: "web"}
	api = Key{Namespace: "shop", Name: "api"}
)

// TestWatcherNotifies drives the fake API through a Service's life and
// checks each step produces the expected Changed calls and view.
func TestWatcherNotifies(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	w, c := startWatcher(t, client, 0)
	services := client.CoreV1().Services("shop")
	slices := client.DiscoveryV1().EndpointSlices("shop")

	step := func(name string, do func() error, want ...Key) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c.expect(t, want...)
	}

	svc := newTestService("shop", "web")
	step("create service", func() error { _, err := services.Create(ctx, svc, metav1.CreateOptions{}); return err }, web)
	step("create api service", func() error {
		_, err := services.Create(ctx, newTestService("shop", "api"), metav1.CreateOptions{})
		return err
	}, api)

	slice := newTestSlice("shop", "web-a", "web", v4, ports(namedPort("http", 8080)), endpoint("p1", "10.0.0.1"))
	step("create slice", func() error { _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); return err }, web)
	assertAddresses(t, w, web, "10.0.0.1")

	// An unlabelled slice notifies nothing: the next notification is the
	// one for the labelled slice created after it.
	loose := newTestSlice("shop", "loose", "", v4, nil, endpoint("p9", "10.0.0.9"))
	step("create unlabelled slice", func() error { _, err := slices.Create(ctx, loose, metav1.CreateOptions{}); return err })
	other := newTestSlice("shop", "api-a", "api", v4, nil, endpoint("p8", "10.0.0.8"))
	step("create slice of api", func() error { _, err := slices.Create(ctx, other, metav1.CreateOptions{}); return err }, api)

	slice.Endpoints = append(slice.Endpoints, endpoint("p2", "10.0.0.2"))
	slice.ResourceVersion = "2"
	step("update slice", func() error { _, err := slices.Update(ctx, slice, metav1.UpdateOptions{}); return err }, web)
	assertAddresses(t, w, web, "10.0.0.1", "10.0.0.2")

	svc.Annotations = map[string]string{"consul.hashicorp.com/service-sync": "false"}
	svc.ResourceVersion = "2"
	step("update service", func() error { _, err := services.Update(ctx, svc, metav1.UpdateOptions{}); return err }, web)

	slice.Labels[discoveryv1.LabelServiceName] = "api"
	slice.ResourceVersion = "3"
	step("move slice to api", func() error { _, err := slices.Update(ctx, slice, metav1.UpdateOptions{}); return err }, web, api)
	assertAddresses(t, w, web)
	assertAddresses(t, w, api, "10.0.0.1", "10.0.0.2", "10.0.0.8")

	step("delete slice", func() error { return slices.Delete(ctx, "web-a", metav1.DeleteOptions{}) }, api)
	step("delete service", func() error { return services.Delete(ctx, "web", metav1.DeleteOptions{}) }, web)
	if _, ok, err := w.Service(web); ok || err != nil {
		t.Errorf("Service(%v) after delete = _, %v, %v; want not found", web, ok, err)
	}
}

// TestWatcherInitialList checks that WaitForSync returns only after every
// object of the first list was notified.
func TestWatcherInitialList(t *testing.T) {
	client := fake.NewClientset(
		newTestService("shop", "web"),
		newTestService("shop", "api"),
		newTestService("bank", "ledger"),
		newTestSlice("shop", "web-a", "web", v4, nil, endpoint("p1", "10.0.0.1")),
	)
	w, c := startWatcher(t, client, 0)

	got := map[Key]int{}
	for len(c.ch) > 0 {
		got[<-c.ch]++
	}
	want := map[Key]int{web: 2, api: 1, {Namespace: "bank", Name: "ledger"}: 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("notified before sync = %v, want %v", got, want)
	}
	wantKeys := []Key{{Namespace: "bank", Name: "ledger"}, api, web}
	if keys := w.Keys(); !reflect.DeepEqual(keys, wantKeys) {
		t.Errorf("Keys() = %v, want %v", keys, wantKeys)
	}
	if _, ok, err := w.Service(Key{Namespace: "shop", Name: "missing"}); ok || err != nil {
		t.Errorf("Service(missing) = _, %v, %v; want not found", ok, err)
	}
}

// TestWatcherStripsCache checks the memory transform: managedFields and
// kubectl's last-applied annotation are not cached, other annotations are.
func TestWatcherStripsCache(t *testing.T) {
	svc := newTestService("shop", "web")
	svc.Annotations[lastAppliedAnnotation] = `{"big":"copy"}`
	svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	slice := newTestSlice("shop", "web-a", "web", v4, nil, endpoint("p1", "10.0.0.1"))
	slice.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "controller"}}
	w, _ := startWatcher(t, fake.NewClientset(svc, slice), 0)

	got, _, err := w.Service(web)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Annotations[lastAppliedAnnotation]; ok || got.Annotations["consul.hashicorp.com/service-sync"] != "true" {
		t.Errorf("Annotations = %v, want only service-sync", got.Annotations)
	}
	if got.Object.ManagedFields != nil {
		t.Errorf("cached Service keeps managedFields %v", got.Object.ManagedFields)
	}
	cached, err := w.slicesOf(web)
	if err != nil || len(cached) != 1 || cached[0].ManagedFields != nil {
		t.Errorf("slicesOf(web) = %v, %v; want one slice without managedFields", cached, err)
	}
}

// TestWatcherNotStarted checks that an unstarted Watcher never reports a
// sync and that Wait does not block.
func TestWatcherNotStarted(t *testing.T) {
	w := NewWatcher(fake.NewClientset(), 0, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if w.WaitForSync(ctx) || w.HasSynced() {
		t.Error("unstarted watcher reports synced")
	}
	w.Wait()
}

func assertAddresses(t *testing.T, w *Watcher, key Key, want ...string) {
	t.Helper()
	svc, ok, err := w.Service(key)
	if err != nil {
		t.Fatalf("Service(%v): %v", key, err)
	}
	var got []string
	if ok {
		for _, e := range svc.Endpoints {
			got = append(got, e.Address)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("Service(%v) addresses = %v, want %v", key, got, want)
	}
}

// TestWatcherHeadIsTheServiceWithoutEndpoints: Head gives what Service
// gives but the merged parts (endpoints, nodes, ingress routes, problems).
func TestWatcherHeadIsTheServiceWithoutEndpoints(t *testing.T) {
	client := fake.NewClientset(
		newTestService("shop", "web"),
		newTestSlice("shop", "web-a", "web", v4, nil, endpoint("p1", "10.0.0.1"), endpoint("p2", "10.0.0.2")),
	)
	w, _ := startWatcher(t, client, 0)
	full, ok, err := w.Service(web)
	if err != nil || !ok || len(full.Endpoints) != 2 {
		t.Fatalf("Service(web) = %+v, %v, %v; want 2 endpoints", full, ok, err)
	}
	head, ok, err := w.Head(web)
	if err != nil || !ok {
		t.Fatalf("Head(web) = _, %v, %v", ok, err)
	}
	if head.Endpoints != nil {
		t.Errorf("Head(web) has endpoints %v", head.Endpoints)
	}
	want := *full
	want.Endpoints, want.Nodes, want.Ingresses, want.Problems = nil, nil, nil, nil
	if !reflect.DeepEqual(*head, want) {
		t.Errorf("Head(web) = %+v\nwant        %+v", *head, want)
	}
	if _, ok, err := w.Head(Key{Namespace: "shop", Name: "missing"}); ok || err != nil {
		t.Errorf("Head(missing) = _, %v, %v; want not found", ok, err)
	}
}
