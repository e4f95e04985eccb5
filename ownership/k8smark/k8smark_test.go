package k8smark

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func TestNewRefusesBadIDs(t *testing.T) {
	for _, id := range []string{"", "has space", "-x", string(make([]byte, 64))} {
		if _, err := New(id); err == nil {
			t.Errorf("New(%q): no error", id)
		}
	}
}

func TestStampAndOwns(t *testing.T) {
	a, _ := New("a")
	b, _ := New("b")
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns", Labels: map[string]string{"user": "kept"}}}
	if err := a.Owns(s); err == nil {
		t.Fatal("unstamped object owned")
	}
	a.Stamp(s)
	if err := a.Owns(s); err != nil {
		t.Fatalf("stamped object not owned: %v", err)
	}
	if err := b.Owns(s); err == nil {
		t.Fatal("cluster b owns cluster a's object")
	}
	if s.Labels["user"] != "kept" || !Marked(s.Labels) {
		t.Fatalf("labels %v", s.Labels)
	}
	if err := (Mark{}).Owns(s); err == nil {
		t.Fatal("the zero Mark owns an object")
	}
	sel, err := labels.Parse(a.Selector())
	if err != nil || !sel.Matches(labels.Set(s.Labels)) {
		t.Fatalf("selector %q (%v) does not match %v", a.Selector(), err, s.Labels)
	}
	s.Labels[LabelManagedBy] = "endpointslice-controller.k8s.io"
	if a.Owns(s) == nil || sel.Matches(labels.Set(s.Labels)) || Marked(s.Labels) {
		t.Fatal("an object managed by someone else still counts as ours")
	}
}
