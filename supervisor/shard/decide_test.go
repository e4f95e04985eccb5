package shard

import (
	"fmt"
	"testing"

	"github.com/fleetsync/fleetsync/k8s"
)

func TestOfIsStableAndSpread(t *testing.T) {
	counts := make([]int, 8)
	for i := range 800 {
		k := k8s.Key{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
		s := Of(k, 8)
		if s != Of(k, 8) {
			t.Fatal("Of is not stable")
		}
		counts[s]++
	}
	for s, n := range counts {
		if n < 50 || n > 150 {
			t.Errorf("shard %d has %d of 800 services: badly spread %v", s, n, counts)
		}
	}
	if Of(k8s.Key{Namespace: "a", Name: "b"}, 1) != 0 {
		t.Error("one shard must be shard 0")
	}
}
