package apply

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestAdoptService: the Service read is handed to adopt; a refusal, or a
// result without the mark, writes nothing; an accepted one is written
// with the resourceVersion read.
func TestAdoptService(t *testing.T) {
	theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1", ResourceVersion: "5",
		Labels: map[string]string{"consul": "true"}}}
	client := fake.NewClientset(theirs)
	w, _ := New(client, labelOwner{}, Options{})
	ctx := context.Background()
	want := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	refused := errors.New("not consul-k8s's")
	if _, err := w.AdoptService(ctx, want, func(*corev1.Service) (*corev1.Service, error) { return nil, refused }); !errors.Is(err, refused) {
		t.Fatalf("refused: err %v", err)
	}
	if _, err := w.AdoptService(ctx, want, func(old *corev1.Service) (*corev1.Service, error) { return old, nil }); !errors.Is(err, ErrNotOurs) {
		t.Fatalf("unmarked result: err %v, want ErrNotOurs", err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() != "get" {
			t.Fatalf("a refused adoption sent %s", a.GetVerb())
		}
	}
	got, err := w.AdoptService(ctx, want, func(old *corev1.Service) (*corev1.Service, error) {
		if old.UID != "u1" || old.Labels["consul"] != "true" {
			t.Errorf("adopt got %+v", old.ObjectMeta)
		}
		old.Labels = map[string]string{"owner": "us"}
		return old, nil
	})
	if err != nil || got.Labels["owner"] != "us" || got.UID != "u1" {
		t.Fatalf("adopted: %v %+v", err, got)
	}
}
