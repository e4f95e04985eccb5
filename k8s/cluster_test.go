package k8s

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func TestClusterUID(t *testing.T) {
	kubeSystem := func(uid string) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: types.UID(uid)}}
	}
	ctx := context.Background()

	got, err := ClusterUID(ctx, fake.NewClientset(kubeSystem("uid")))
	if err != nil || got != "uid" {
		t.Errorf("ClusterUID() = %q, %v; want uid", got, err)
	}

	_, err = ClusterUID(ctx, fake.NewClientset())
	if !apierrors.IsNotFound(err) {
		t.Errorf("ClusterUID() without kube-system: error %v, want a wrapped NotFound", err)
	}

	if _, err := ClusterUID(ctx, fake.NewClientset(kubeSystem(""))); err == nil {
		t.Error("ClusterUID() with an empty uid: no error")
	}
}
