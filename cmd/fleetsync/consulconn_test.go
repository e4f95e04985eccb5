package main

import (
	"fmt"
	"testing"

	"github.com/fleetsync/fleetsync/consul/conn"
)

// TestConsulAccessFlags: the login, address, datacenter and scope flags
// parse, and combinations that cannot work are refused naming the flags.
func TestConsulAccessFlags(t *testing.T) {
	runFlagCases(t, []flagCase{
		{name: "login defaults", args: []string{"--cluster-id=x", "--consul-login-auth-method=k8s"}, check: func(t *testing.T, c config) {
			lc, err := consulLogin(c, "", func(string) string { return "" })
			if err != nil || lc == nil || lc.BearerTokenFile != conn.DefaultBearerTokenFile || lc.AuthMethod != "k8s" {
				t.Errorf("login %+v, %v", lc, err)
			}
		}},
		{name: "login and a static token", args: []string{"--cluster-id=x", "--consul-login-auth-method=k8s", "--consul-token-file=/t"}, wantErr: "choose one"},
		{name: "login meta", args: []string{"--cluster-id=x", "--consul-login-meta=component=fleetsync", "--consul-login-meta=team = infra"}, check: func(t *testing.T, c config) {
			m, err := c.loginMeta()
			if err != nil || len(m) != 2 || m["component"] != "fleetsync" || m["team"] != "infra" {
				t.Errorf("meta %v, %v", m, err)
			}
		}},
		{name: "bad login meta", args: []string{"--cluster-id=x", "--consul-login-meta=nokey"}, wantErr: `--consul-login-meta="nokey"`},
		{name: "several addresses, from env too", env: map[string]string{"FLEETSYNC_CLUSTER_ID": "x", "FLEETSYNC_CONSUL_ADDRESS": "a:8500,b:8500"},
			args: []string{"--consul-address=c:8500"}, check: func(t *testing.T, c config) {
				if c.ConsulAddr.String() != "c:8500" {
					t.Errorf("args must win over the variable: %q", c.ConsulAddr.String())
				}
			}},
		{name: "mirroring prefix alone", args: []string{"--cluster-id=x", "--k8s-namespace-mirroring-prefix=k8s-"}, wantErr: "needs --enable-k8s-namespace-mirroring"},
		{name: "mirroring and a namespace", args: []string{"--cluster-id=x", "--enable-k8s-namespace-mirroring", "--consul-namespace=team"}, wantErr: "choose one"},
		{name: "namespaces off by default", args: []string{"--cluster-id=x"}, check: func(t *testing.T, c config) {
			if c.EnableNamespaces || c.mirroring() || consulScope(c, func(string) string { return "" }).Enterprise() {
				t.Errorf("namespaces on by default: %+v", c)
			}
		}},
		{name: "enable-namespaces turns mirroring on, as the consul chart", args: []string{"--cluster-id=x", "--enable-namespaces", "--k8s-namespace-mirroring-prefix=k8s-"},
			check: func(t *testing.T, c config) {
				s := consulScope(c, func(k string) string { return map[string]string{"CONSUL_NAMESPACE": "env-ns"}[k] })
				if !s.MirrorNamespaces || s.MirrorPrefix != "k8s-" || s.Namespace != "" {
					t.Errorf("scope %+v, want mirroring with prefix k8s- and no namespace from the environment", s)
				}
			}},
		{name: "enable-namespaces from the environment", env: map[string]string{"FLEETSYNC_CLUSTER_ID": "x", "FLEETSYNC_ENABLE_NAMESPACES": "true"},
			check: func(t *testing.T, c config) {
				if !c.mirroring() {
					t.Error("FLEETSYNC_ENABLE_NAMESPACES=true: mirroring off")
				}
			}},
		{name: "enable-namespaces with a destination namespace", args: []string{"--cluster-id=x", "--enable-namespaces", "--enable-k8s-namespace-mirroring=false", "--consul-namespace=team"},
			check: func(t *testing.T, c config) {
				if s := consulScope(c, func(string) string { return "" }); s.MirrorNamespaces || s.Namespace != "team" {
					t.Errorf("scope %+v, want namespace team without mirroring", s)
				}
			}},
		{name: "enable-namespaces and a namespace without turning mirroring off", args: []string{"--cluster-id=x", "--enable-namespaces", "--consul-namespace=team"},
			wantErr: "add --enable-k8s-namespace-mirroring=false"},
		{name: "mirroring off by env, prefix refused", env: map[string]string{"FLEETSYNC_ENABLE_K8S_NAMESPACE_MIRRORING": "false"},
			args: []string{"--cluster-id=x", "--enable-namespaces", "--k8s-namespace-mirroring-prefix=p-"}, wantErr: "needs --enable-k8s-namespace-mirroring"},
		{name: "bad mirroring value names the variable", env: map[string]string{"FLEETSYNC_ENABLE_K8S_NAMESPACE_MIRRORING": "yes please"},
			args: []string{"--cluster-id=x"}, wantErr: "FLEETSYNC_ENABLE_K8S_NAMESPACE_MIRRORING"},
	})
}

func TestConsulScopeAndPodMeta(t *testing.T) {
	env := map[string]string{"CONSUL_NAMESPACE": "from-env", "CONSUL_PARTITION": "p-env", "POD_NAMESPACE": "fs", "POD_NAME": "fleetsync-0"}
	get := func(k string) string { return env[k] }
	if s := consulScope(config{}, get); s.Namespace != "from-env" || s.Partition != "p-env" {
		t.Errorf("env defaults: %+v", s)
	}
	mirror := optionalBool{value: true, set: true}
	if s := consulScope(config{ConsulNamespace: "flag", MirrorNamespaces: mirror}, get); s.Namespace != "flag" || !s.MirrorNamespaces {
		t.Errorf("flags win: %+v", s)
	}
	if s := consulScope(config{MirrorNamespaces: mirror}, get); s.Namespace != "" {
		t.Errorf("mirroring takes no namespace from the environment: %+v", s)
	}
	if m := withPodMeta(nil, get); m["pod"] != "fs/fleetsync-0" {
		t.Errorf("pod meta %v", m)
	}
	if m := withPodMeta(map[string]string{"pod": "mine"}, get); m["pod"] != "mine" {
		t.Errorf("explicit pod meta replaced: %v", m)
	}
	if m := withPodMeta(nil, func(string) string { return "" }); m != nil {
		t.Errorf("pod meta without the variables: %v", m)
	}
}

// TestNeededPermissionsNameTheFences: with shards, the start-up check
// asks for write on the shards' fence keys under the claim prefix as well
// as on the claim; with one shard, only on the claim.
func TestNeededPermissionsNameTheFences(t *testing.T) {
	for _, tc := range []struct {
		shards string
		want   []string
	}{
		{"1", []string{"fleetsync/clusters/x"}},
		{"2", []string{"fleetsync/clusters/x", "fleetsync/clusters/x/shards/0"}},
	} {
		c, err := parseArgs(t, []string{"--cluster-id=x", "--shards=" + tc.shards}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, p := range neededPermissions(c, "k8s-x") {
			if p.Resource == "key" {
				keys = append(keys, p.Segment)
			}
		}
		if fmt.Sprint(keys) != fmt.Sprint(tc.want) {
			t.Errorf("--shards=%s: key permissions %v, want %v", tc.shards, keys, tc.want)
		}
	}
}
