package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// writeCA writes a throwaway CA and a server certificate for 127.0.0.1 into
// dir and returns the paths (ca, cert, key).
func writeCA(t *testing.T, dir string) (string, string, string) {
	t.Helper()
	f, err := stack.WriteTLSFiles(dir)
	must(t, err)
	return f.CA, f.Cert, f.Key
}

// TestTLSAndTokenRotation: fleetsync talks HTTPS to a Consul agent with a
// throwaway CA and ACLs on; without the CA it refuses the connection; when
// the token file is rotated (and the old token deleted) it keeps syncing;
// no token ever shows in its log, /debug output or /metrics.
func TestTLSAndTokenRotation(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	tlsFiles, err := stack.WriteTLSFiles(dir)
	must(t, err)
	caFile := tlsFiles.CA
	const management = "f1e2d3c4-0000-4000-8000-00000000root"
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{Token: management, TLS: &tlsFiles, ExtraArgs: []string{quietConsul,
		fmt.Sprintf(`-hcl=acl { enabled = true default_policy = "deny" tokens { initial_management = %q } }`, management),
	}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	admin := own.Client
	// The policy documented in docs/operations.md, for this cluster id.
	policy, _, err := admin.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: "fleetsync-" + e.cluster,
		Rules: strings.ReplaceAll(aclRules, "<cluster-id>", e.cluster)}, nil)
	must(t, err)
	link := []*consulapi.ACLTokenPolicyLink{{ID: policy.ID}}
	tokA, _, err := admin.ACL().TokenCreate(&consulapi.ACLToken{Description: "fleetsync A", Policies: link}, nil)
	must(t, err)
	tokB, _, err := admin.ACL().TokenCreate(&consulapi.ACLToken{Description: "fleetsync B", Policies: link}, nil)
	must(t, err)
	tokenFile := filepath.Join(dir, "token")
	must(t, os.WriteFile(tokenFile, []byte(tokA.SecretID+"\n"), 0o600))

	names, keys := svcSet(t, e, "tls", 2, 2, 140)
	addr := own.HTTPSAddr
	start := func(name string, args ...string) *fixture.Daemon {
		d, err := fixture.SpawnDaemon(e.ctx, fixture.DaemonConfig{ClusterID: e.cluster, Kubeconfig: kube.KubeconfigPath,
			ConsulAddr: addr, Namespaces: []string{e.ns}, Name: name,
			Args: append([]string{"--consul-ssl", "--consul-token-file=" + tokenFile, "--consul-unreachable-grace=2s"}, args...)})
		must(t, err)
		t.Cleanup(func() { d.CloseT(t) })
		return d
	}

	// Without the CA: the certificate is not trusted, nothing is written.
	untrusting := start("fleetsync-no-ca")
	eventually(t, 15*time.Second, "TLS refusal in the log", func() error {
		if !strings.Contains(untrusting.LogTail(50), "certificate signed by unknown authority") {
			return fmt.Errorf("no certificate error yet")
		}
		return nil
	})
	if n, _ := fixture.NodeServiceCount(own.Client, e.node()); n != 0 {
		t.Fatalf("%d instances written without a verified connection", n)
	}
	must(t, untrusting.Close())

	// Spread over 8 nodes: the policy's node_prefix rule is what lets it
	// write k8s-<id>.1 to .7 and list them.
	d := start("fleetsync-tls", "--consul-ca-file="+caFile, "--consul-nodes=8")
	must(t, d.WaitReady(e.ctx, 30*time.Second))
	e.waitCount(own.Client, len(keys), 15*time.Second)
	_, nodes, err := fixture.ClusterServiceCount(own.Client, e.cluster)
	must(t, err)
	t.Logf("synced %d instances over HTTPS with token A, on %d nodes", len(keys), nodes)

	rotate := func(secret string, changes int) {
		t.Helper()
		must(t, os.WriteFile(tokenFile+".new", []byte(secret), 0o600))
		must(t, os.Rename(tokenFile+".new", tokenFile)) // atomic, as a Secret volume update
		eventually(t, 15*time.Second, "new token picked up", func() error {
			if strings.Count(d.LogTail(200), "Consul token file changed") != changes {
				return fmt.Errorf("not yet")
			}
			return nil
		})
	}
	// A token Consul does not know: writes are refused (so the token from
	// the file is what requests carry), nothing is written.
	const unknown = "00000000-1111-4222-8333-444444444444"
	rotate(unknown, 1)
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, names[0], "rotated", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(150, 0, 1))))
	eventually(t, 15*time.Second, "ACL refusal", func() error {
		if !strings.Contains(d.LogTail(50), "ACL not found") {
			return fmt.Errorf("no ACL error yet")
		}
		return nil
	})
	if n, _, _ := fixture.ClusterServiceCount(own.Client, e.cluster); n != len(keys) {
		t.Fatalf("%d instances written with an unknown token", n)
	}
	// Rotate to token B and delete token A: the pending change lands.
	rotate(tokB.SecretID, 2)
	_, err = admin.ACL().TokenDelete(tokA.AccessorID, nil)
	must(t, err)
	e.waitCount(own.Client, len(keys)+1, 40*time.Second)
	t.Logf("unknown token refused; after rotating to token B (token A deleted) the pending change synced")

	// The tokens never show.
	var seen []string
	for _, p := range []string{"/debug/workers", "/debug/workers/" + e.ns + "/" + names[0], "/metrics", "/readyz"} {
		_, body, err := d.Get(e.ctx, p, "")
		must(t, err)
		seen = append(seen, body)
	}
	logs, err := os.ReadFile(d.LogPath)
	must(t, err)
	seen = append(seen, string(logs), untrusting.LogTail(200))
	for _, s := range seen {
		for _, tok := range []string{tokA.SecretID, tokB.SecretID, management, unknown} {
			if strings.Contains(s, tok) {
				t.Fatalf("a Consul token appears in fleetsync's output")
			}
		}
	}
}

// aclRules is the least-privilege policy of docs/operations.md.
const aclRules = `
node "k8s-<cluster-id>" { policy = "write" }
node_prefix "k8s-<cluster-id>." { policy = "write" }
service_prefix "" { policy = "write" }
session_prefix "" { policy = "write" }
key_prefix "fleetsync/clusters/" { policy = "write" }
`
