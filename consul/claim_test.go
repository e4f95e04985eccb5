package consul

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestClusterIDClaim(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	opts := func(uid, holder string, takeover bool) ClaimOptions {
		return ClaimOptions{ClusterID: "east", KubeUID: uid, Holder: holder, Takeover: takeover, TTL: 10 * time.Second}
	}
	first, err := ClaimClusterID(ctx, a.Client, opts("uid-1", "pod-a", false))
	if err != nil {
		t.Fatal(err)
	}
	if v, held, err := ReadClaim(ctx, a.Client, "", "east"); err != nil || !held || v.KubeUID != "uid-1" {
		t.Fatalf("ReadClaim = %+v, held %v, %v", v, held, err)
	}
	// A second replica of the same Kubernetes cluster is fine.
	replica, err := ClaimClusterID(ctx, a.Client, opts("uid-1", "pod-b", false))
	if err != nil {
		t.Fatalf("replica of the same cluster refused: %v", err)
	}
	replica.Release()

	// Another Kubernetes cluster with the same id is refused, and told why.
	_, err = ClaimClusterID(ctx, a.Client, opts("uid-2", "pod-x", false))
	if !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("other cluster: err = %v, want ErrClaimedByOther", err)
	}
	for _, s := range []string{`"east"`, "uid-1", "uid-2", "pod-a", "--takeover-cluster-id", "held by a live session"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q does not mention %s", err, s)
		}
	}
	// Takeover is refused while the claim is held, allowed once released.
	if _, err := ClaimClusterID(ctx, a.Client, opts("uid-2", "pod-x", true)); !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("takeover of a held claim: err = %v", err)
	}
	first.Release()
	if _, err := ClaimClusterID(ctx, a.Client, opts("uid-2", "pod-x", false)); !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("released claim of another cluster: err = %v, want still refused", err)
	}
	second, err := ClaimClusterID(ctx, a.Client, opts("uid-2", "pod-x", true))
	if err != nil {
		t.Fatalf("takeover after release: %v", err)
	}
	defer second.Release()
	if _, err := ClaimClusterID(ctx, a.Client, opts("uid-1", "pod-a", false)); !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("the old cluster after a takeover: err = %v, want refused", err)
	}
}
