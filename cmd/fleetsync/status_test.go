package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/consul/claim"
)

var sampleReport = statusReport{Consul: "http://127.0.0.1:8500", Inventory: admin.Inventory{
	Index: 1300,
	Clusters: []admin.ClusterInventory{
		{ClusterID: "east", Node: "k8s-east", Services: 2, Instances: 5, Passing: 4, Warning: 1, Foreign: 1, LastWriteIndex: 1200,
			InstancesByService: map[string]int{"web": 3, "db": 2}},
		{ClusterID: "west-2", Node: "k8s-west-2", Services: 1, Instances: 2, Passing: 2, LastWriteIndex: 990,
			InstancesByService: map[string]int{"web": 2}, Claim: &admin.ClaimStatus{Held: true,
				Value: claim.Value{ClusterID: "west-2", KubeUID: "7d4c", Holder: "fleetsync-5f6d-x2", ClaimedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}},
		{ClusterID: "gone", InstancesByService: map[string]int{}, Claim: &admin.ClaimStatus{
			Value: claim.Value{ClusterID: "gone", KubeUID: "91ab", Holder: "fleetsync-77-q"}}},
	},
	Others: []admin.OtherNode{{Node: "k8s-sync", Entries: 12}},
}}

func TestWriteStatusTable(t *testing.T) {
	var b bytes.Buffer
	if err := writeStatusTable(&b, sampleReport); err != nil {
		t.Fatal(err)
	}
	want := `CLUSTER  NODE        SERVICES  INSTANCES  PASSING  WARNING  CRITICAL  FOREIGN  LAST WRITE INDEX  CLAIM
east     k8s-east    2         5          4        1        0         1        1200              none
west-2   k8s-west-2  1         2          2        0        0         0        990               held by fleetsync-5f6d-x2 (uid 7d4c)
gone     -           0         0          0        0        0         0        0                 released by fleetsync-77-q (uid 91ab)

Consul http://127.0.0.1:8500, catalog index 1300. FOREIGN: entries on the node without the cluster's mark (fleetsync never touches them).
CLAIM: held (a fleetsync runs) or released, by the Kubernetes cluster with that kube-system UID.

Other nodes with external-source=kubernetes (not fleetsync's; consul-k8s writes to k8s-sync):
  NODE      ENTRIES
  k8s-sync  12
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	if err := writeStatusTable(&b, statusReport{Consul: "http://c:8500"}); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "No fleetsync cluster in Consul at http://c:8500 (no node k8s-<id> with meta external-source=kubernetes and k8s-cluster=<id>).\n" {
		t.Errorf("empty table: %q", got)
	}
}

func TestWriteStatusJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeStatusJSON(&b, sampleReport); err != nil {
		t.Fatal(err)
	}
	var back statusReport
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, b.String())
	}
	for _, key := range []string{`"consul": "http://127.0.0.1:8500"`, `"index": 1300`, `"cluster_id": "east"`, `"node": "k8s-east"`,
		`"services": 2`, `"instances": 5`, `"passing": 4`, `"warning": 1`, `"critical": 0`, `"foreign_entries": 1`,
		`"last_write_index": 1200`, `"instances_by_service": {`, `"db": 2`, `"other_nodes": [`, `"entries": 12`,
		`"claim": null`, `"kubernetesClusterUID": "7d4c"`, `"holder": "fleetsync-5f6d-x2"`, `"claimedAt": "2026-01-02T03:04:05Z"`, `"held": true`} {
		if !strings.Contains(b.String(), key) {
			t.Errorf("JSON lacks %s:\n%s", key, b.String())
		}
	}
	if len(back.Clusters) != 3 || back.Clusters[1].ClusterID != "west-2" || !back.Clusters[1].Claim.Held || back.Others[0].Node != "k8s-sync" {
		t.Errorf("decoded again: %+v", back)
	}
	// Empty lists are [] (not null), so scripts can iterate without checks.
	b.Reset()
	_ = writeStatusJSON(&b, statusReport{Inventory: admin.Inventory{Clusters: []admin.ClusterInventory{}, Others: []admin.OtherNode{}}})
	if !strings.Contains(b.String(), `"clusters": []`) || !strings.Contains(b.String(), `"other_nodes": []`) {
		t.Errorf("empty JSON: %s", b.String())
	}
}

func TestSubcommandFlags(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		env      map[string]string
		code     int
		inStderr string
	}{
		{name: "status help", args: []string{"status", "--help"}, code: 0, inStderr: "Usage: fleetsync status"},
		{name: "status bad output", args: []string{"status", "-o", "yaml"}, code: 2, inStderr: `-o "yaml": must be table or json`},
		{name: "status extra args", args: []string{"status", "east"}, code: 2, inStderr: "unexpected arguments"},
		{name: "status daemon flag", args: []string{"status", "--window=1s"}, code: 2, inStderr: "flag provided but not defined: -window"},
		{name: "purge help", args: []string{"purge", "--help"}, code: 0, inStderr: "Usage: fleetsync purge"},
		{name: "purge needs a cluster id", args: []string{"purge"}, code: 2, inStderr: "--cluster-id is required"},
		{name: "purge ignores FLEETSYNC_CLUSTER_ID", args: []string{"purge", "--yes"}, env: map[string]string{"FLEETSYNC_CLUSTER_ID": "east"},
			code: 2, inStderr: "--cluster-id is required"},
		{name: "purge ignores FLEETSYNC_YES", args: []string{"purge"}, env: map[string]string{"FLEETSYNC_YES": "true"},
			code: 2, inStderr: "--cluster-id is required"},
		{name: "purge bad cluster id", args: []string{"purge", "--cluster-id=East"}, code: 2, inStderr: "DNS label"},
		{name: "bad consul env names the variable", args: []string{"status"}, env: map[string]string{"FLEETSYNC_CONSUL_SSL": "maybe"},
			code: 2, inStderr: "FLEETSYNC_CONSUL_SSL"},
		{name: "consul unreachable", args: []string{"status", "--consul-address=127.0.0.1:1", "--timeout=5s"}, code: 1,
			inStderr: "list nodes with meta external-source=kubernetes"},
		{name: "purge consul unreachable", args: []string{"purge", "--cluster-id=east", "--consul-address=127.0.0.1:1", "--timeout=5s"}, code: 1,
			inStderr: "read the claim of cluster east"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := run(c.args, &out, &errb)
			if code != c.code || !strings.Contains(errb.String(), c.inStderr) {
				t.Errorf("code %d (want %d), stderr %q (want it to contain %q)", code, c.code, errb.String(), c.inStderr)
			}
		})
	}
}

// TestConsulFlagsAreTheDaemons: the subcommands take exactly the daemon's
// Consul connection flags, with the same usage and defaults.
func TestConsulFlagsAreTheDaemons(t *testing.T) {
	var daemonCfg, subCfg config
	daemonFS := flag.NewFlagSet("d", flag.ContinueOnError)
	daemonCfg.registerFlags(daemonFS)
	subFS := flag.NewFlagSet("s", flag.ContinueOnError)
	registerConsulFlags(subFS, &subCfg, true)
	n := 0
	subFS.VisitAll(func(f *flag.Flag) {
		n++
		d := daemonFS.Lookup(f.Name)
		if d == nil || d.Usage != f.Usage || d.DefValue != f.DefValue {
			t.Errorf("flag %s differs from the daemon's: %+v vs %+v", f.Name, f, d)
		}
	})
	if n != len(consulConnectionFlags)+len(consulLoginFlags) {
		t.Errorf("%d flags, want %d", n, len(consulConnectionFlags)+len(consulLoginFlags))
	}
	if err := subFS.Parse([]string{"--consul-address=c:8501", "--consul-ssl", "--consul-token-file=/t"}); err != nil {
		t.Fatal(err)
	}
	cc := consulConnConfig(subCfg)
	if len(cc.Addresses) != 1 || cc.Addresses[0] != "c:8501" || !cc.SSL || cc.TokenFile != "/t" {
		t.Errorf("consulConnConfig from subcommand flags: %+v", cc)
	}
}
