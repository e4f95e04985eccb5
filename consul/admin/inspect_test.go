package admin_test

import (
	"encoding/json"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/admin"
)

func TestSummarize(t *testing.T) {
	east, west := mustCluster(t, "east"), mustCluster(t, "west")
	foreign := consul.Registered{Instance: consul.Instance{ID: "by-hand", Name: "web"}, Node: east.NodeName(), ServiceIndex: 90}
	westOnEast := owned(west, "web", "10.0.0.9", consul.StatusPassing, 95, 96)
	westOnEast.Node = east.NodeName() // carries west's mark, but sits on east's node: not east's, not west's
	entries := []consul.Registered{
		owned(east, "web", "10.0.0.1", consul.StatusPassing, 10, 11),
		owned(east, "web", "10.0.0.2", consul.StatusWarning, 12, 40),
		owned(east, "db", "10.0.0.3", consul.StatusCritical, 13, 14),
		owned(east, "db", "10.0.0.4", "", 15, 0),
		foreign, westOnEast,
	}
	got := admin.Summarize(east, 5, entries)
	want := admin.ClusterInventory{ClusterID: "east", Node: "k8s-east", Services: 2, Instances: 4, Passing: 1, Warning: 1, Critical: 1,
		Foreign: 2, LastWriteIndex: 96, InstancesByService: map[string]int{"web": 2, "db": 2}}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("summarize:\n got %s\nwant %s", gotJSON, wantJSON)
	}
	if s := admin.Summarize(east, 7, nil); s.LastWriteIndex != 7 || s.Instances != 0 || s.Services != 0 {
		t.Errorf("empty node: %+v", s)
	}
}
