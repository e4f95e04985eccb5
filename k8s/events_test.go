package k8s

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestRecorder(t *testing.T) {
	client := fake.NewClientset()
	created := make(chan *corev1.Event, 10)
	client.PrependReactor("create", "events", func(action k8stesting.Action) (bool, runtime.Object, error) {
		created <- action.(k8stesting.CreateAction).GetObject().(*corev1.Event)
		return false, nil, nil
	})
	r := NewRecorder(client, "fleetsync", nil)
	defer r.Shutdown()
	svc := newTestService("shop", "web")

	r.Warning(nil, "NoObject", "only logged")
	r.Normal(svc, "Synced", "all good")
	r.Warning(svc, "BadAnnotation", "window is not a duration")

	for _, want := range []struct{ typ, reason, message string }{
		{corev1.EventTypeNormal, "Synced", "all good"},
		{corev1.EventTypeWarning, "BadAnnotation", "window is not a duration"},
	} {
		var got *corev1.Event
		select {
		case got = <-created:
		case <-time.After(wait.ForeverTestTimeout):
			t.Fatalf("no %s event created", want.reason)
		}
		if got.Type != want.typ || got.Reason != want.reason || got.Message != want.message {
			t.Errorf("event = %s %s %q, want %s %s %q", got.Type, got.Reason, got.Message, want.typ, want.reason, want.message)
		}
		ref := got.InvolvedObject
		if ref.Kind != "Service" || ref.Namespace != "shop" || ref.Name != "web" || ref.UID != svc.UID {
			t.Errorf("involvedObject = %+v, want Service shop/web", ref)
		}
		if got.Source.Component != "fleetsync" || got.Namespace != "shop" {
			t.Errorf("event source %q in namespace %q, want fleetsync in shop", got.Source.Component, got.Namespace)
		}
	}

	r.Shutdown()
	r.Warning(svc, "AfterShutdown", "only logged") // must not panic
}
