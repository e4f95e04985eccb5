package main

import (
	"testing"

	"github.com/fleetsync/fleetsync/supervisor/shard"
)

// TestShardConfigDefaults: the Lease namespace defaults to $POD_NAMESPACE,
// else default; the replica id to the host name; flags win.
func TestShardConfigDefaults(t *testing.T) {
	host := func() (string, error) { return "pod-1", nil }
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "POD_NAMESPACE" {
				return v
			}
			return ""
		}
	}
	for _, tt := range []struct {
		flags  shard.Config
		podNS  string
		ns, id string
	}{
		{shard.Config{}, "fleetsync", "fleetsync", "pod-1"},
		{shard.Config{}, "", "default", "pod-1"},
		{shard.Config{Namespace: "leases", ReplicaID: "r"}, "fleetsync", "leases", "r"},
	} {
		got := shardConfig(tt.flags, env(tt.podNS), host)
		if got.Namespace != tt.ns || got.ReplicaID != tt.id {
			t.Errorf("flags %+v, POD_NAMESPACE %q: namespace %q, replica %q; want %q, %q", tt.flags, tt.podNS, got.Namespace, got.ReplicaID, tt.ns, tt.id)
		}
	}
}
