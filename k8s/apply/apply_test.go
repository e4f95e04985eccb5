package apply

import (
	"context"
	"errors"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// labelOwner owns objects labelled owner=us: a stand-in for k8smark.
type labelOwner struct{}

func (labelOwner) Owns(o metav1.Object) error {
	if o.GetLabels()["owner"] != "us" {
		return errors.New("no owner=us label")
	}
	return nil
}

func slice(name string, owner string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
		Labels: map[string]string{"owner": owner}, UID: "uid-" + types.UID(name), ResourceVersion: "7"},
		AddressType: discoveryv1.AddressTypeIPv4}
}

func TestRefusesWhatIsNotOurs(t *testing.T) {
	client := fake.NewClientset()
	w, err := New(client, labelOwner{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ours, theirs := slice("a", "us"), slice("a", "them")
	checks := map[string]error{}
	_, checks["create theirs"] = w.CreateSlice(ctx, theirs)
	_, checks["update theirs to ours"] = w.UpdateSlice(ctx, theirs, ours)
	_, checks["update ours to unmarked"] = w.UpdateSlice(ctx, ours, theirs)
	checks["delete theirs"] = w.DeleteSlice(ctx, theirs)
	for name, err := range checks {
		if !errors.Is(err, ErrNotOurs) {
			t.Errorf("%s: err %v, want ErrNotOurs", name, err)
		}
	}
	if n := len(client.Actions()); n != 0 {
		t.Fatalf("%d requests sent for refused writes: %v", n, client.Actions())
	}
}

func TestDeleteCarriesPreconditions(t *testing.T) {
	client := fake.NewClientset()
	var got *metav1.Preconditions
	client.PrependReactor("delete", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		got = a.(k8stesting.DeleteAction).GetDeleteOptions().Preconditions
		return true, nil, nil
	})
	var observed []string
	w, _ := New(client, labelOwner{}, Options{QPS: 100, Burst: 1, Observe: func(verb, kind string, err error) { observed = append(observed, verb+" "+kind) }})
	s := slice("a", "us")
	s.UID = "u1"
	if err := w.DeleteSlice(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.UID == nil || *got.UID != "u1" || got.ResourceVersion == nil || *got.ResourceVersion != "7" {
		t.Fatalf("preconditions %+v, want UID u1 and resourceVersion 7", got)
	}
	if len(observed) != 1 || observed[0] != "delete EndpointSlice" {
		t.Fatalf("observed %v", observed)
	}
}
