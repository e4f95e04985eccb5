package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real servers and fleetsync; skipped under -short")
	}
}

// TestSoakQuick is `make soak SOAK=--quick` shortened to 100 s (part of
// `make test`; `make soak-test` runs it alone): every fault kind at least
// once, overlapping, over 200 + 30 churning Services and a second cluster
// id, on three Consul servers, alpha on 2 replicas with --shards 4 as `make
// soak` runs it; no invariant may break.
func TestSoakQuick(t *testing.T) {
	skipShort(t)
	out, err := os.MkdirTemp("", "soak-quick-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("result.json, timeline.png and the daemons' logs kept in %s", out)
			return
		}
		_ = os.RemoveAll(out)
	})
	o, err := parse([]string{"--quick", "--duration=100s", "--out=" + out})
	if err != nil {
		t.Fatal(err)
	}
	res, err := run(context.Background(), o, t.Output())
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	for _, v := range res.Violations {
		t.Errorf("violation %s at %.1fs (fault %s) %s: %s", v.Rule, v.At, v.Fault, v.Object, v.Detail)
	}
	for _, k := range allFaults() {
		if res.Faults[k] == 0 {
			t.Errorf("fault %s was never injected", k)
		}
	}
	if res.Changes == 0 || res.Txns == 0 || res.Samples < 100 {
		t.Errorf("the run did too little: %d changes, %d transactions, %d samples", res.Changes, res.Txns, res.Samples)
	}
	if res.Gaps["none"] == nil || res.Gaps["none"].Count == 0 {
		t.Error("no missing-instance streak was measured at all: the checker saw no change land")
	}
	for _, f := range []string{"result.json", "timeline.png"} {
		if st, err := os.Stat(filepath.Join(o.out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

// TestCheckerCatchesBrokenBuild: the checker is able to fail. A fleetsync
// built to never deregister (-tags fleetsync_broken_nodelete) leaves the
// instances of endpoints that went away in Consul, and the checker reports
// them stale past the bound; the real build, same churn, reports nothing.
func TestCheckerCatchesBrokenBuild(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name   string
		tags   string
		broken bool
	}{
		{"real build", "", false},
		{"broken build", "fleetsync_broken_nodelete", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse([]string{"--services=20", "--services-beta=0", "--replicas=1", "--shards=1", "--consul-servers=1",
				"--duration=25s", "--faults=", "--bound=10s", "--converge=20s", "--idle=3s", "--tags=" + tc.tags, "--out=" + t.TempDir(), "--seed=3"})
			if err != nil {
				t.Fatal(err)
			}
			res, err := run(context.Background(), o, t.Output())
			if err != nil {
				t.Fatalf("harness: %v", err)
			}
			if res.Changes == 0 {
				t.Fatal("no churn")
			}
			caught := slices.ContainsFunc(res.Violations, func(v violation) bool { return v.Rule == "instance-stale" || v.Rule == "converge" })
			switch {
			case tc.broken && !caught:
				t.Fatalf("the broken build left nothing stale the checker saw; violations: %+v", res.Violations)
			case !tc.broken && len(res.Violations) > 0:
				t.Fatalf("the real build broke invariants: %+v", res.Violations)
			}
		})
	}
}
