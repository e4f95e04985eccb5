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
	got = Rules(Config{ClusterID: "prod-east", ClaimPrefix: "fleetsync/clusters", ServicePrefix: "team-", ToK8s: true})
	if !strings.HasSuffix(got, want+`service_prefix "" { policy = "read" }`+"\n"+`node_prefix "" { policy = "read" }`+"\n") {
		t.Errorf("to-k8s rules:\n%s", got)
	}
	got = Rules(Config{ClusterID: "prod-east", ClaimPrefix: "fleetsync/clusters", ToK8s: true})
	if !strings.Contains(got, `service_prefix "" { policy = "write" }`) || strings.Contains(got, `service_prefix "" { policy = "read" }`) ||
		!strings.HasSuffix(got, `node_prefix "" { policy = "read" }`+"\n") {
		t.Errorf("to-k8s rules, every name written:\n%s", got)
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
