package claim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestClusterIDClaim(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	opts := func(uid, holder string, takeover bool) Options {
		return Options{ClusterID: "east", KubeUID: uid, Holder: holder, Takeover: takeover, TTL: 10 * time.Second}
	}
	first, err := ClusterID(ctx, a.Client, opts("uid-1", "pod-a", false))
	if err != nil {
		t.Fatal(err)
	}
	if v, held, err := Read(ctx, a.Client, "", "east"); err != nil || !held || v.KubeUID != "uid-1" {
		t.Fatalf("Read = %+v, held %v, %v", v, held, err)
	}
	// A second replica of the same Kubernetes cluster is fine.
	replica, err := ClusterID(ctx, a.Client, opts("uid-1", "pod-b", false))
	if err != nil {
		t.Fatalf("replica of the same cluster refused: %v", err)
	}
	replica.Release()

	// Another Kubernetes cluster with the same id is refused, and told why.
	_, err = ClusterID(ctx, a.Client, opts("uid-2", "pod-x", false))
	if !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("other cluster: err = %v, want ErrClaimedByOther", err)
	}
	for _, s := range []string{`"east"`, "uid-1", "uid-2", "pod-a", "--takeover-cluster-id", "held by a live session"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q does not mention %s", err, s)
		}
	}
	// Takeover is refused while the claim is held, allowed once released.
	if _, err := ClusterID(ctx, a.Client, opts("uid-2", "pod-x", true)); !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("takeover of a held claim: err = %v", err)
	}
	first.Release()
	if _, err := ClusterID(ctx, a.Client, opts("uid-2", "pod-x", false)); !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("released claim of another cluster: err = %v, want still refused", err)
	}
	second, err := ClusterID(ctx, a.Client, opts("uid-2", "pod-x", true))
	if err != nil {
		t.Fatalf("takeover after release: %v", err)
	}
	defer second.Release()
	if _, err := ClusterID(ctx, a.Client, opts("uid-1", "pod-a", false)); !errors.Is(err, ErrClaimedByOther) {
		t.Fatalf("the old cluster after a takeover: err = %v, want refused", err)
	}
}

// TestKeepSeesTheClaimTakenAndEndsWithItsContext: Keep, run by its owner,
// re-checks the claim: once another Kubernetes cluster takes it (the
// session gone, a takeover), Held says so and names that cluster, and Keep
// goes on (writing resumes if the claim comes back); Keep returns nil when
// its context ends, and Release does not wait for a Keep that is not
// running.
func TestKeepSeesTheClaimTakenAndEndsWithItsContext(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	opts := func(uid string, takeover bool) Options {
		return Options{ClusterID: "kept", KubeUID: uid, Holder: "pod-" + uid, Takeover: takeover, TTL: 10 * time.Second, CheckInterval: 20 * time.Millisecond}
	}
	cl, err := ClusterID(ctx, a.Client, opts("uid-1", false))
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := context.WithCancel(ctx)
	kept := make(chan error, 1)
	go func() { kept <- cl.Keep(kctx) }()
	pair, _, err := a.Client.KV().Get(DefaultPrefix+"/kept", nil)
	if err != nil || pair == nil || pair.Session == "" {
		t.Fatalf("claim not held: %+v, %v", pair, err)
	}
	if _, err := a.Client.Session().Destroy(pair.Session, nil); err != nil {
		t.Fatal(err)
	}
	other, err := ClusterID(ctx, a.Client, opts("uid-2", true))
	if err != nil {
		t.Fatalf("takeover: %v", err)
	}
	defer other.Release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, why := cl.Held()
		if !held && strings.Contains(why, "uid-2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Held = %v, %q after another cluster took the claim; want lost, naming uid-2", held, why)
		}
		time.Sleep(10 * time.Millisecond) // polls an observable condition
	}
	select {
	case err := <-kept:
		t.Fatalf("Keep returned %v while its context lives", err)
	default:
	}
	stop()
	select {
	case err := <-kept:
		if err != nil {
			t.Fatalf("Keep = %v, want nil when its context ends", err)
		}
	case <-time.After(10 * time.Second): // failsafe
		t.Fatal("Keep did not return after its context ended")
	}
	cl.Release()
	if err := cl.Keep(ctx); err != nil { // released: returns at once
		t.Fatalf("Keep after Release = %v", err)
	}
}
