package aclsetup

import (
	"strings"
	"testing"
)

func TestRules(t *testing.T) {
	got := Rules(Config{ClusterID: "prod-east", ClaimPrefix: "fleetsync/clusters", ServicePrefix: "team-"})
	want := `node "k8s-prod-east" { policy = "write" }
node_prefix "k8s-prod-east." { policy = "write" }
service_prefix "team-" { policy = "write" }
session_prefix "" { policy = "write" }
key_prefix "fleetsync/clusters/" { policy = "write" }
`
	if got != want {
		t.Errorf("rules:\n%s\nwant:\n%s", got, want)
	}
	cfg := Config{ClusterID: "x", ServiceAccount: "fleetsync", Namespace: "ops"}
	if s := cfg.Selector(); s != `serviceaccount.name=="fleetsync" and serviceaccount.namespace=="ops"` {
		t.Errorf("selector %s", s)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{ClaimPrefix: "p"}, "cluster id is required"},
		{Config{ClusterID: "x", ClaimPrefix: "/"}, "claim prefix is required"},
		{Config{ClusterID: "x", ClaimPrefix: "p", AuthMethod: "k8s", Namespace: "ops"}, "ServiceAccount's name and namespace"},
		{Config{ClusterID: "x", ClaimPrefix: "p", AuthMethod: "k8s", ServiceAccount: "fs", Namespace: "ops"}, ""},
		{Config{ClusterID: "x", ClaimPrefix: "p"}, ""},
	} {
		err := c.cfg.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}
